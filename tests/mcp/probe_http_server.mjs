#!/usr/bin/env node
// The tests' tiny MCP server over streamable HTTP (MCP 2025-06-18): POST <any path> with one
// JSON-RPC 2.0 message. A request is answered with an application/json body; a notification
// or a response gets 202 with none; GET and DELETE get 405 (no server-initiated stream, no
// sessions to end). No dependencies. One tool, `probe {text: string}`, answering
// `probe says: <TEXT UPPERCASED>`, as tests/mcp/probe_server.mjs does over stdio.
//
// Run as `node <absolute path>/probe_http_server.mjs`: it listens on 127.0.0.1 (port
// PROBE_PORT, else any free one) and prints `listening <port>` on stdout. With
// PROBE_LOG=<file> set, every message it reads is appended to that file as a line
// `{"headers": {...}, "message": ...}` (the request's headers, lowercased, and the message).

import { appendFileSync } from "node:fs";
import { createServer } from "node:http";

const log = process.env.PROBE_LOG;

const tool = {
  name: "probe",
  description: "Echo the text back, uppercased (a test tool).",
  inputSchema: {
    type: "object",
    properties: { text: { type: "string", description: "The text to echo." } },
    required: ["text"],
  },
};

function answer(request) {
  const { method, params } = request;
  switch (method) {
    case "initialize":
      return {
        result: {
          protocolVersion: params?.protocolVersion ?? "2025-06-18",
          capabilities: { tools: {} },
          serverInfo: { name: "probe", version: "1.0.0" },
        },
      };
    case "ping":
      return { result: {} };
    case "tools/list":
      return { result: { tools: [tool] } };
    case "tools/call": {
      if (params?.name !== "probe") {
        return { error: { code: -32602, message: `unknown tool: ${params?.name}` } };
      }
      const text = String(params?.arguments?.text ?? "");
      return {
        result: {
          content: [{ type: "text", text: "probe says: " + text.toUpperCase() }],
          isError: false,
        },
      };
    }
    default:
      return { error: { code: -32601, message: `method not found: ${method}` } };
  }
}

const server = createServer((req, res) => {
  if (req.method !== "POST") {
    res.writeHead(405, { allow: "POST" }).end();
    return;
  }
  let body = "";
  req.setEncoding("utf8");
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    let message;
    try {
      message = JSON.parse(body);
    } catch {
      message = undefined;
    }
    if (log) {
      try {
        appendFileSync(log, JSON.stringify({ headers: req.headers, message: message ?? body }) + "\n");
      } catch {}
    }
    if (message === undefined) {
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32700, message: "parse error" } }));
      return;
    }
    // A notification or a response to us: taken, nothing to answer.
    if (message === null || typeof message !== "object" || message.id === undefined || !message.method) {
      res.writeHead(202).end();
      return;
    }
    const reply = JSON.stringify({ jsonrpc: "2.0", id: message.id, ...answer(message) });
    res.writeHead(200, { "content-type": "application/json" });
    res.end(reply);
  });
});

server.listen(Number(process.env.PROBE_PORT ?? 0), "127.0.0.1", () => {
  process.stdout.write(`listening ${server.address().port}\n`);
});
