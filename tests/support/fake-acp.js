#!/usr/bin/env node
// A scripted ACP v1 agent for fault tests (tests/acp_faults.rs): not a real agent, but the
// protocol cases real ones show and the tests need on demand. FAKE_ACP_MODE:
// - "load-only": `loadSession` only (no resume, no fork); history is kept in
//   $HOME/fake-acp/<id>.json; a load replays it, part of it after the load answer (as Gemini does).
// - "new-on-resume": offers `session/resume`, and answers it with another session id.
// - "junk-and-die": a prompt gets a few non-JSON lines, then the process exits 3 mid-turn.
// - "hang-on-new": `session/new` is never answered.
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
  } else if (method === 'session/prompt') {
    const sessionId = params.sessionId;
    const text = (params.prompt || []).map((p) => p.text || '').join('');
    if (mode === 'junk-and-die') {
      process.stdout.write('this is not JSON\n{"half": \n');
      setTimeout(() => process.exit(3), 20);
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
