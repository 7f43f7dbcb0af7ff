#!/usr/bin/env node
// A scripted ACP v1 agent for the crash torture (tests/suite/torture.rs): every prompt streams many
// blocks as fast as the host takes them — text messages, thoughts and tool calls, each a few
// brackets — then ends the turn. It keeps no state on disk: `session/resume` (the only way it
// offers to continue a session) answers at once, so a host restarted after SIGKILL resumes the
// bound session and goes on.
//
// TORTURE_BLOCKS: blocks per prompt (default 400; about 2.4 brackets a block; the test sets it).
'use strict';
const readline = require('readline');

const blocks = Number(process.env.TORTURE_BLOCKS || 400);
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const update = (sessionId, u) =>
  send({ jsonrpc: '2.0', method: 'session/update', params: { sessionId, update: u } });
const chunk = (sessionId, kind, text, messageId) =>
  update(sessionId, { sessionUpdate: kind, content: { type: 'text', text }, messageId });

let sessions = 0;
let turns = 0;

// One block: i % 5 picks what it is, so every turn has all three kinds.
function block(sessionId, turn, i) {
  const id = `${process.pid}-${turn}-${i}`;
  switch (i % 5) {
    case 3:
      chunk(sessionId, 'agent_thought_chunk', `thinking ${i} `, 'th-' + id);
      chunk(sessionId, 'agent_thought_chunk', 'about it', 'th-' + id);
      break;
    case 4: {
      const toolCallId = 'tool-' + id;
      update(sessionId, { sessionUpdate: 'tool_call', toolCallId, title: `step ${i}`, kind: 'other',
        status: 'pending', rawInput: { step: i } });
      update(sessionId, { sessionUpdate: 'tool_call_update', toolCallId, status: 'in_progress' });
      update(sessionId, { sessionUpdate: 'tool_call_update', toolCallId, status: 'completed',
        content: [{ type: 'content', content: { type: 'text', text: `done ${i}` } }] });
      break;
    }
    default:
      chunk(sessionId, 'agent_message_chunk', `block ${i} `, 'msg-' + id);
      chunk(sessionId, 'agent_message_chunk', 'of the answer', 'msg-' + id);
  }
}

function prompt(id, sessionId, text) {
  const turn = ++turns;
  process.stderr.write(`torture-acp: turn ${turn}: ${text.length} characters\n`);
  let i = 0;
  // In slices, so stdin is still read between them.
  const step = () => {
    for (const end = Math.min(i + 25, blocks); i < end; i++) block(sessionId, turn, i);
    if (i < blocks) {
      setImmediate(step);
    } else {
      send({ jsonrpc: '2.0', id, result: { stopReason: 'end_turn' } });
    }
  };
  step();
}

readline.createInterface({ input: process.stdin }).on('line', (line) => {
  let msg;
  try { msg = JSON.parse(line); } catch (e) { return; }
  const { id, method, params } = msg;
  if (method === 'initialize') {
    send({ jsonrpc: '2.0', id, result: { protocolVersion: 1,
      agentCapabilities: { loadSession: false, sessionCapabilities: { resume: {} } },
      agentInfo: { name: 'torture-acp', version: '0.0.1' }, authMethods: [] } });
  } else if (method === 'session/new') {
    send({ jsonrpc: '2.0', id, result: { sessionId: `torture-${process.pid}-${++sessions}` } });
  } else if (method === 'session/resume') {
    send({ jsonrpc: '2.0', id, result: {} });
  } else if (method === 'session/prompt') {
    const text = (params.prompt || []).map((p) => p.text || '').join('');
    prompt(id, params.sessionId, text);
  } else if (id !== undefined && method) {
    send({ jsonrpc: '2.0', id, error: { code: -32601, message: 'method not found' } });
  }
});
