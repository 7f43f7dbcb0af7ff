#!/usr/bin/env python3
"""Record transcripts of the real `claude` CLI (agents/node_modules) driven against the
project's mock model server (examples/mock_model.rs), one scenario per file, into
fixtures/claude/<scenario>.jsonl: the CLI's stdout lines, with temp paths replaced.

Run it inside a network namespace that has only loopback, so nothing can leave the machine:

    cargo build --example mock_model
    unshare -n sh -c 'ip link set lo up && scripts/record-claude-fixtures.py'

The translator tests (src/adapter/claude) read these files; re-recording changes them, and
`AGENT_HOST_BLESS=1 cargo test --lib claude` rewrites the expected events beside them for review.
"""
import json, os, shutil, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAUDE = os.path.join(ROOT, "agents/node_modules/.bin/claude")
MOCK = os.path.join(ROOT, "target/debug/examples/mock_model")
OUT = os.path.join(ROOT, "fixtures/claude")
SESSION = "11111111-2222-4333-8444-555555555555"


def user(text):
    return {"type": "user", "message": {"role": "user", "content": text}, "parent_tool_use_id": None, "session_id": ""}


def run(name, prompts, on_frame=None):
    home = tempfile.mkdtemp(prefix="rec-home-")
    work = os.path.join(home, "work")
    os.makedirs(work)
    env = {
        "HOME": home, "PATH": "/usr/bin:/bin", "ANTHROPIC_BASE_URL": BASE, "ANTHROPIC_API_KEY": "mock",
        "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    args = [CLAUDE, "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
            "--include-partial-messages", "--permission-prompt-tool", "stdio", "--session-id", SESSION]
    proc = subprocess.Popen(args, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1)
    lines = []
    def send(obj):
        proc.stdin.write(json.dumps(obj) + "\n")
        proc.stdin.flush()
    for prompt in prompts:
        send(user(prompt))
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            try:
                frame = json.loads(line)
            except ValueError:
                continue
            if on_frame:
                on_frame(frame, send)
            if frame.get("type") == "result":
                break
    proc.stdin.close()
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
    proc.wait(timeout=30)
    text = "\n".join(lines) + "\n"
    text = text.replace(work, "/WORK").replace(home, "/HOME").replace(BASE.split("//")[1], "127.0.0.1:PORT")
    with open(os.path.join(OUT, name + ".jsonl"), "w") as f:
        f.write(text)
    shutil.rmtree(home, ignore_errors=True)
    print(f"{name}: {len(lines)} lines, exit {proc.returncode}")
    return text


def answer(behavior):
    def on_frame(frame, send):
        req = frame.get("request") or {}
        if frame.get("type") == "control_request" and req.get("subtype") == "can_use_tool":
            if behavior == "allow":
                response = {"behavior": "allow", "updatedInput": req.get("input", {})}
            else:
                response = {"behavior": "deny", "message": "denied by the fixture recorder"}
            send({"type": "control_response", "response": {"subtype": "success", "request_id": frame["request_id"], "response": response}})
    return on_frame


def interrupt_after_first_delta():
    state = {"sent": False}
    def on_frame(frame, send):
        event = frame.get("event") or {}
        if not state["sent"] and frame.get("type") == "stream_event" and event.get("type") == "content_block_delta":
            state["sent"] = True
            send({"type": "control_request", "request_id": "int-1", "request": {"subtype": "interrupt"}})
    return on_frame


mock = subprocess.Popen([MOCK], stdout=subprocess.PIPE, text=True)
BASE = mock.stdout.readline().strip()
os.makedirs(OUT, exist_ok=True)
try:
    basic = run("basic", ["hello there"])
    run("multiturn", ["first question", "second question"])
    run("thinking", ["THINK about it"])
    run("permission-allow", ["TOOLCALL `touch made-by-tool && echo from-the-tool`"], answer("allow"))
    run("permission-deny", ["TOOLCALL `touch never-made && echo never`"], answer("deny"))
    run("interrupt", ["SLOW please", "after the interrupt"], interrupt_after_first_delta())
    run("api-error", ["FAIL500"])
    run("context-exhausted", ["OVERFLOW"])
    # A frame type this build does not know, as a newer CLI might send: it must be skipped.
    lines = basic.splitlines()
    lines.insert(2, json.dumps({"type": "hologram", "subtype": "beam", "session_id": SESSION}))
    lines.insert(3, "this line is not JSON")
    with open(os.path.join(OUT, "unknown-frame.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("unknown-frame: from basic, plus two injected lines")
finally:
    mock.kill()
