#!/usr/bin/env node
// A scripted ACP v1 agent that asks for permission (tests/suite/session_states.rs): not a real agent,
// but the one exchange the session-state tests need on demand.
// - `session/new` answers a new session id.
// - a prompt "ASK <n>" sends <n> `session/request_permission` requests (tool calls `call-1`..),
//   each offering allow once / reject once, and ends its turn once all are answered, with the
//   reply "answered: <optionId>,<optionId>..." in the order the answers came.
// - any other prompt is answered "echo: <text>" at once.
// Its pid is written to $PERMISSION_ACP_PIDS (a file) when set, one line per process started.
'use strict';
const fs = require('fs');
const readline = require('readline');

const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const say = (sessionId, text, messageId) => send({ jsonrpc: '2.0', method: 'session/update',
  params: { sessionId, update: { sessionUpdate: 'agent_message_chunk', content: { type: 'text', text }, messageId } } });
if (process.env.PERMISSION_ACP_PIDS) fs.appendFileSync(process.env.PERMISSION_ACP_PIDS, process.pid + '\n');

let counter = 0;
let asking = null;
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  let msg;
  try { msg = JSON.parse(line); } catch (e) { return; }
  const { id, method, params } = msg;
  if (method === undefined && id !== undefined && asking && asking.waiting.has(id)) {
    // An answer to one of our permission requests.
    asking.waiting.delete(id);
    const outcome = (msg.result && msg.result.outcome) || {};
    asking.answers.push(outcome.optionId || outcome.outcome || 'none');
    if (asking.waiting.size === 0) {
      const { sessionId, promptId, answers } = asking;
      asking = null;
      say(sessionId, 'answered: ' + answers.join(','), 'msg-' + promptId);
      send({ jsonrpc: '2.0', id: promptId, result: { stopReason: 'end_turn' } });
    }
  } else if (method === 'initialize') {
    send({ jsonrpc: '2.0', id, result: { protocolVersion: 1,
      agentCapabilities: { loadSession: false, sessionCapabilities: {} },
      agentInfo: { name: 'permission-acp', version: '0.0.1' }, authMethods: [] } });
  } else if (method === 'session/new') {
    send({ jsonrpc: '2.0', id, result: { sessionId: 'ask-' + process.pid + '-' + (++counter) } });
  } else if (method === 'session/cancel') {
    if (asking) {
      const promptId = asking.promptId;
      asking = null;
      send({ jsonrpc: '2.0', id: promptId, result: { stopReason: 'cancelled' } });
    }
  } else if (method === 'session/prompt') {
    const sessionId = params.sessionId;
    const text = (params.prompt || []).map((p) => p.text || '').join('');
    const ask = /^ASK (\d+)$/.exec(text);
    if (!ask) {
      say(sessionId, 'echo: ' + text, 'msg-' + id);
      send({ jsonrpc: '2.0', id, result: { stopReason: 'end_turn' } });
      return;
    }
    asking = { sessionId, promptId: id, waiting: new Set(), answers: [] };
    for (let i = 1; i <= Number(ask[1]); i++) {
      const requestId = 'perm-' + id + '-' + i;
      asking.waiting.add(requestId);
      send({ jsonrpc: '2.0', id: requestId, method: 'session/request_permission', params: {
        sessionId,
        toolCall: { toolCallId: 'call-' + i, title: 'ls ' + i, kind: 'execute', status: 'pending',
          rawInput: { command: 'ls ' + i } },
        options: [
          { optionId: 'once-' + i, name: 'Allow once', kind: 'allow_once' },
          { optionId: 'no-' + i, name: 'Reject', kind: 'reject_once' },
        ],
      } });
    }
  } else if (id !== undefined && method) {
    send({ jsonrpc: '2.0', id, error: { code: -32601, message: 'method not found' } });
  }
});
