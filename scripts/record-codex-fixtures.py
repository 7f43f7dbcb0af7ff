#!/usr/bin/env python3
"""Record transcripts of the real `codex app-server` (agents/node_modules) driven against the
project's mock model server (examples/mock_model.rs, its Responses API), one scenario per file,
into fixtures/codex/<scenario>.jsonl: the app-server's stdout lines (JSON-RPC, one object a
line), with temp paths and the mock's port replaced. Each scenario is also checked (the reply
texts, the approval, the interrupt, the failure), so a run that prints no FAIL recorded what it
names.

Run it inside a network namespace that has only loopback, so nothing can leave the machine:

    cargo build --example mock_model
    unshare -n sh -c 'ip link set lo up && scripts/record-codex-fixtures.py'

Optional: `--base http://127.0.0.1:PORT` uses a mock already running there instead of starting one.
"""
import json, os, queue, shutil, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODEX = os.path.join(ROOT, "agents/node_modules/.bin/codex")
MOCK = os.path.join(ROOT, "target/debug/examples/mock_model")
OUT = os.path.join(ROOT, "fixtures/codex")
WAIT = 30
FAILURES = []

CONFIG = """model = "mock-model"
model_provider = "mock"
approval_policy = "on-request"
sandbox_mode = "workspace-write"
check_for_update_on_startup = false
[model_providers.mock]
name = "Mock LLM"
base_url = "{base}/v1"
env_key = "MOCK_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 60000
[analytics]
enabled = false
[feedback]
enabled = false
[otel]
exporter = "none"
"""


def check(ok, what):
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        FAILURES.append(what)


class Home:
    """A private HOME and CODEX_HOME (HOME/.codex) with the config, and a work dir."""

    def __init__(self):
        self.home = tempfile.mkdtemp(prefix="rec-codex-")
        self.codex_home = os.path.join(self.home, ".codex")
        self.work = os.path.join(self.home, "work")
        os.makedirs(self.codex_home)
        os.makedirs(self.work)
        with open(os.path.join(self.codex_home, "config.toml"), "w") as f:
            f.write(CONFIG.format(base=BASE))
        self.env = {"HOME": self.home, "CODEX_HOME": self.codex_home, "PATH": "/usr/bin:/bin",
                    "MOCK_API_KEY": "mock"}

    def remove(self):
        shutil.rmtree(self.home, ignore_errors=True)


class AppServer:
    """One `codex app-server` process; every stdout line is kept."""

    def __init__(self, home):
        self.home = home
        self.proc = subprocess.Popen([CODEX, "app-server"], cwd=home.work, env=home.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines = []
        self.next_id = 1
        # A reader thread, so a wait can time out (select on a buffered pipe would miss lines).
        self.queue = queue.Queue()
        threading.Thread(target=self.pump, daemon=True).start()
        self.request(
            "initialize",
            {"clientInfo": {"name": "agent_host_fixtures", "title": "agent-host fixtures", "version": "0.0.1"},
             "capabilities": {"experimentalApi": False}})
        self.send({"method": "initialized"})

    def send(self, obj):
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def pump(self):
        for line in self.proc.stdout:
            self.queue.put(line)
        self.queue.put(None)

    def read(self, timeout=WAIT):
        """The next stdout frame, or None at EOF or timeout."""
        try:
            line = self.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            self.queue.put(None)
            return None
        self.lines.append(line.rstrip("\n"))
        try:
            return json.loads(line)
        except ValueError:
            return {}

    def request(self, method, params, on_frame=None):
        rid = self.next_id
        self.next_id += 1
        self.send({"id": rid, "method": method, "params": params})
        while True:
            frame = self.read()
            if frame is None:
                raise RuntimeError(f"no answer to {method}")
            if frame.get("id") == rid and "method" not in frame:
                if "error" in frame:
                    raise RuntimeError(f"{method}: {frame['error']}")
                return frame["result"]
            if on_frame:
                on_frame(frame, self)

    def turn(self, thread_id, text, on_frame=None):
        """Run one turn; its completed turn object, the final agent text, and the frames."""
        frames = []
        def keep(frame, server):
            frames.append(frame)
            if on_frame:
                on_frame(frame, server)
        start = self.request("turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": text, "text_elements": []}]}, keep)
        self.turn_id = start["turn"]["id"]
        while not any(f.get("method") == "turn/completed" for f in frames):
            frame = self.read()
            if frame is None:
                raise RuntimeError(f"turn did not complete: {text}")
            keep(frame, self)
        turn = next(f for f in frames if f.get("method") == "turn/completed")["params"]["turn"]
        texts = [f["params"]["item"]["text"] for f in frames
                 if f.get("method") == "item/completed" and f["params"]["item"].get("type") == "agentMessage"]
        return turn, (texts[-1] if texts else ""), frames

    def close(self):
        self.proc.stdin.close()
        while self.read(timeout=10) is not None:
            pass
        self.proc.wait(timeout=10)
        return self.proc.returncode


def start_thread(server):
    result = server.request("thread/start", {"cwd": server.home.work, "approvalPolicy": "on-request", "sandbox": "workspace-write"})
    return result["thread"]["id"]


def save(name, server, home):
    code = server.close()
    text = "\n".join(server.lines) + "\n"
    text = text.replace(home.work, "/WORK").replace(home.home, "/HOME").replace(BASE.split("//")[1], "127.0.0.1:PORT")
    with open(os.path.join(OUT, name + ".jsonl"), "w") as f:
        f.write(text)
    print(f"{name}: {len(server.lines)} lines, exit {code}")
    check(code == 0, f"{name}: exit 0 on stdin EOF")


def echo(text, n, first):
    return f"echo: {text} [user turns seen: {n}; first: {first}]"


def answer(decision):
    def on_frame(frame, server):
        if frame.get("method") == "item/commandExecution/requestApproval" and "id" in frame:
            server.send({"id": frame["id"], "result": {"decision": decision}})
    return on_frame


def interrupt_after_first_delta():
    state = {"sent": False}
    def on_frame(frame, server):
        if not state["sent"] and frame.get("method") == "item/agentMessage/delta":
            state["sent"] = True
            server.send({"id": 9000, "method": "turn/interrupt", "params": {"threadId": frame["params"]["threadId"], "turnId": frame["params"]["turnId"]}})
    return on_frame


def basic():
    home = Home()
    server = AppServer(home)
    thread = start_thread(server)
    turn, text, _ = server.turn(thread, "hello there")
    check(turn["status"] == "completed" and text == echo("hello there", 1, "hello there"), f"basic: {text!r}")
    save("basic", server, home)
    home.remove()


def multiturn_and_resume():
    home = Home()
    server = AppServer(home)
    thread = start_thread(server)
    _, text1, _ = server.turn(thread, "first question")
    _, text2, _ = server.turn(thread, "second question")
    check(text1 == echo("first question", 1, "first question"), f"multiturn 1: {text1!r}")
    check(text2 == echo("second question", 2, "first question"), f"multiturn 2: {text2!r}")
    save("multiturn", server, home)
    server = AppServer(home)
    resumed = server.request("thread/resume", {"threadId": thread})
    check(resumed["thread"]["id"] == thread, "resume: same thread id")
    _, text3, _ = server.turn(thread, "third question")
    check(text3 == echo("third question", 3, "first question"), f"resume: {text3!r}")
    save("resume", server, home)
    home.remove()


def approval(decision, name, command, marker):
    home = Home()
    server = AppServer(home)
    thread = start_thread(server)
    turn, text, frames = server.turn(thread, f"TOOLCALL ESCALATE `{command}`", answer(decision))
    asked = [f for f in frames if f.get("method") == "item/commandExecution/requestApproval"]
    check(len(asked) == 1, f"{name}: one approval request")
    check(turn["status"] == "completed" and text.startswith("tool said: "), f"{name}: {text[:90]!r}")
    made = os.path.exists(os.path.join(home.work, marker))
    if decision == "accept":
        check(made and "from-the-tool" in text, f"{name}: the command ran and its output came back")
    else:
        check(not made and "rejected" in text, f"{name}: the command did not run")
    save(name, server, home)
    home.remove()


def interrupt():
    home = Home()
    server = AppServer(home)
    thread = start_thread(server)
    started = time.time()
    turn, _, _ = server.turn(thread, "SLOW please", interrupt_after_first_delta())
    check(turn["status"] == "interrupted" and time.time() - started < 5, f"interrupt: {turn['status']} after {time.time() - started:.1f}s")
    turn, text, _ = server.turn(thread, "after the interrupt")
    check(turn["status"] == "completed" and text == echo("after the interrupt", 2, "SLOW please"), f"interrupt, next turn: {text!r}")
    save("interrupt", server, home)
    home.remove()


def api_error():
    home = Home()
    server = AppServer(home)
    thread = start_thread(server)
    started = time.time()
    turn, _, _ = server.turn(thread, "FAIL500")
    took = time.time() - started
    check(turn["status"] == "failed" and took < 5, f"api-error: {turn['status']} after {took:.1f}s")
    save("api-error", server, home)
    home.remove()


if "--base" in sys.argv:
    mock = None
    BASE = sys.argv[sys.argv.index("--base") + 1]
else:
    mock = subprocess.Popen([MOCK], stdout=subprocess.PIPE, text=True)
    BASE = mock.stdout.readline().strip()
os.makedirs(OUT, exist_ok=True)
try:
    basic()
    multiturn_and_resume()
    approval("accept", "approval-accept", "touch made-by-tool && echo from-the-tool", "made-by-tool")
    approval("decline", "approval-decline", "touch never-made && echo never", "never-made")
    interrupt()
    api_error()
finally:
    if mock:
        mock.kill()
print("all checks passed" if not FAILURES else f"{len(FAILURES)} FAILED")
sys.exit(1 if FAILURES else 0)
