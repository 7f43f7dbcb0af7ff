#!/usr/bin/env node
// A scripted ACP v1 agent for fault tests (tests/suite/acp_faults.rs): not a real agent, but the
// protocol cases real ones show and the tests need on demand. FAKE_ACP_MODE:
// - "load-only": `loadSession` only (no resume, no fork); history is kept in
//   $HOME/fake-acp/<id>.json; a load replays it, part of it after the load answer (as Gemini does).
// - "new-on-resume": offers `session/resume`, and answers it with another session id.
// - "junk-and-die": a prompt gets a few non-JSON lines, then the process exits 3 mid-turn.
// - "hang-on-new": `session/new` is never answered.
// - "huge-block": a prompt gets one text block of 5 MiB (over the host's 4 MiB event limit).
// - "fail-new": `session/new` fails as claude-agent-acp does when its CLI dies: a bare
//   "Internal error" message, the cause only in the error's `data`, and stderr lines before.
// - "stream": a prompt gets a new 1 KiB text block every 5 ms until `session/cancel` (then
//   it ends `cancelled`) or 4000 blocks; every prompt received is appended to
//   $FAKE_ACP_PROMPTS (a file), so a test can see what reached the agent and when.
// Replies: "echo: <text> [turns: N]".
'use strict';
const fs = require('fs');
const path = require('path');
const readline = require('readline');

const mode = process.env.FAKE_ACP_MODE || 'load-only';
const dir = path.join(process.env.HOME || '/tmp', 'fake-acp');
fs.mkdirSync(dir, { recursive: true });
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const file = (id) => path.join(dir, id.replace(/[^A-Za-z0-9_-]/g, '_') + '.json');
const load = (id) => { try { return JSON.parse(fs.readFileSync(file(id), 'utf8')); } catch (e) { return null; } };
const save = (id, h) => fs.writeFileSync(file(id), JSON.stringify(h));
const update = (sessionId, u) => send({ jsonrpc: '2.0', method: 'session/update', params: { sessionId, update: u } });
const chunk = (sessionId, kind, text, messageId) =>
  update(sessionId, { sessionUpdate: kind, content: { type: 'text', text }, messageId });

let counter = 0;
let streaming = null;
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  let msg;
  try { msg = JSON.parse(line); } catch (e) { return; }
  const { id, method, params } = msg;
  if (method === 'initialize') {
    const sessionCapabilities = mode === 'new-on-resume' ? { resume: {} } : {};
    send({ jsonrpc: '2.0', id, result: { protocolVersion: 1,
      agentCapabilities: { loadSession: mode !== 'new-on-resume', sessionCapabilities },
      agentInfo: { name: 'fake-acp', version: '0.0.1' }, authMethods: [] } });
  } else if (method === 'session/new' && mode === 'hang-on-new') {
    // Never answered.
  } else if (method === 'session/new' && mode === 'fail-new') {
    process.stderr.write('spawning the CLI with ANTHROPIC_API_KEY=sk-ant-api03-fakefakefakefakefakefake\n');
    process.stderr.write('the CLI said: invalid configuration at line 3\n');
    // The wrapper notices its CLI's exit a moment after the CLI's last words, as a real one.
    setTimeout(() => send({ jsonrpc: '2.0', id, error: { code: -32603, message: 'Internal error',
      data: { details: 'Claude Code process exited with code 1' } } }), 100);
  } else if (method === 'session/new') {
    const sessionId = 'fake-' + process.pid + '-' + (++counter);
    save(sessionId, []);
    send({ jsonrpc: '2.0', id, result: { sessionId } });
  } else if (method === 'session/load') {
    const history = load(params.sessionId);
    if (!history) {
      send({ jsonrpc: '2.0', id, error: { code: -32603, message: 'Session not found' } });
      return;
    }
    const half = Math.ceil(history.length / 2);
    const replay = (items) => items.forEach(([kind, text], i) => chunk(params.sessionId, kind, text, 'replay-' + i));
    replay(history.slice(0, half));
    send({ jsonrpc: '2.0', id, result: null });
    setTimeout(() => replay(history.slice(half)), 50);
  } else if (method === 'session/resume') {
    const sessionId = 'fake-other-' + process.pid;
    save(sessionId, []);
    send({ jsonrpc: '2.0', id, result: { sessionId } });
  } else if (method === 'session/cancel') {
    if (streaming) streaming.cancel();
  } else if (method === 'session/prompt') {
    const sessionId = params.sessionId;
    const text = (params.prompt || []).map((p) => p.text || '').join('');
    if (process.env.FAKE_ACP_PROMPTS) fs.appendFileSync(process.env.FAKE_ACP_PROMPTS, text + '\n');
    if (mode === 'stream') {
      let n = 0;
      const end = (stopReason) => {
        clearInterval(timer);
        streaming = null;
        send({ jsonrpc: '2.0', id, result: { stopReason } });
      };
      const timer = setInterval(() => {
        n += 1;
        chunk(sessionId, 'agent_message_chunk', `block ${n} ` + 'y'.repeat(1024), `${id}-${n}`);
        if (n >= 4000) end('end_turn');
      }, 5);
      streaming = { cancel: () => end('cancelled') };
      return;
    }
    if (mode === 'junk-and-die') {
      process.stdout.write('this is not JSON\n{"half": \n');
      setTimeout(() => process.exit(3), 20);
      return;
    }
    if (mode === 'huge-block') {
      chunk(sessionId, 'agent_message_chunk', 'start ', 'huge');
      chunk(sessionId, 'agent_message_chunk', 'x'.repeat(5 * 1024 * 1024), 'huge');
      send({ jsonrpc: '2.0', id, result: { stopReason: 'end_turn' } });
      return;
    }
    const history = load(sessionId) || [];
    history.push(['user_message_chunk', text]);
    const turns = history.filter(([k]) => k === 'user_message_chunk').length;
    const reply = `echo: ${text} [turns: ${turns}]`;
    history.push(['agent_message_chunk', reply]);
    save(sessionId, history);
    const messageId = 'msg-' + turns;
    reply.split(/(?<= )/).forEach((piece) => chunk(sessionId, 'agent_message_chunk', piece, messageId));
    send({ jsonrpc: '2.0', id, result: { stopReason: 'end_turn' } });
  } else if (id !== undefined && method) {
    send({ jsonrpc: '2.0', id, error: { code: -32601, message: 'method not found' } });
  }
});
