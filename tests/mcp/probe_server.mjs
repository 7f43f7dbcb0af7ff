#!/usr/bin/env node
// The tests' tiny MCP server: stdio transport, newline-delimited JSON-RPC 2.0, no
// dependencies. One tool, `probe {text: string}`, answering `probe says: <TEXT UPPERCASED>`,
// so a test can tell the tool ran (the model only sees what the tool returned).
//
// - `initialize` -> the client's protocolVersion echoed, capabilities {tools: {}}, serverInfo;
// - notifications (no id, e.g. `notifications/initialized`) -> ignored;
// - `ping` -> {};
// - `tools/list` -> the one tool;
// - `tools/call` `probe` -> content [{type: "text", text: "probe says: ..."}];
// - anything else with an id -> JSON-RPC error -32601 (method not found).
//
// Run as `node <absolute path>/probe_server.mjs`. With PROBE_LOG=<file> set, every message
// it reads is appended to that file as a line `{"message": ..., "headers"?: {...}}` (what the
// client sent; over HTTP with the request's headers, lowercased).
//
// `--http` serves the same over HTTP on 127.0.0.1 instead (port PROBE_PORT, else any free
// one; it prints `listening <port>` on stdout once it listens): the streamable HTTP transport
// at `/mcp` (a POST of a message gets its answer as application/json; a notification, 202),
// and the older SSE transport at `/sse` (a GET opens the event stream, whose first `endpoint`
// event names where to POST; answers come back on the stream as `message` events).

import { appendFileSync } from "node:fs";
import { createServer } from "node:http";
import { randomUUID } from "node:crypto";
import { createInterface } from "node:readline";

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
  const { id, method, params } = request;
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

// The answer to one message's text: a JSON-RPC message, or null for a notification (no id)
// or a response to us.
function handle(text, headers) {
  if (log) {
    let message = text;
    try {
      message = JSON.parse(text);
    } catch {}
    try {
      appendFileSync(log, JSON.stringify({ message, headers }) + "\n");
    } catch {}
  }
  let request;
  try {
    request = JSON.parse(text);
  } catch {
    return { jsonrpc: "2.0", id: null, error: { code: -32700, message: "parse error" } };
  }
  if (request === null || typeof request !== "object" || request.id === undefined || !request.method) {
    return null;
  }
  return { jsonrpc: "2.0", id: request.id, ...answer(request) };
}

function body(req) {
  return new Promise((resolve) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
  });
}

function serveHttp() {
  const streams = new Map();
  const server = createServer(async (req, res) => {
    const url = new URL(req.url, "http://127.0.0.1");
    if (url.pathname === "/mcp" && req.method === "POST") {
      const reply = handle(await body(req), req.headers);
      if (reply === null) {
        res.writeHead(202).end();
      } else {
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(reply));
      }
    } else if (url.pathname === "/sse" && req.method === "GET") {
      const id = randomUUID();
      res.writeHead(200, {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        connection: "keep-alive",
      });
      res.write(`event: endpoint\ndata: /messages?sessionId=${id}\n\n`);
      streams.set(id, res);
      req.on("close", () => streams.delete(id));
    } else if (url.pathname === "/messages" && req.method === "POST") {
      const stream = streams.get(url.searchParams.get("sessionId"));
      if (!stream) {
        res.writeHead(404).end("no such stream");
        return;
      }
      const reply = handle(await body(req), req.headers);
      res.writeHead(202).end("Accepted");
      if (reply !== null) stream.write(`event: message\ndata: ${JSON.stringify(reply)}\n\n`);
    } else if (url.pathname === "/mcp" && req.method === "DELETE") {
      res.writeHead(200).end();
    } else {
      res.writeHead(405, { allow: "POST" }).end();
    }
  });
  server.listen(Number(process.env.PROBE_PORT ?? 0), "127.0.0.1", () => {
    process.stdout.write(`listening ${server.address().port}\n`);
  });
  // Gone with the test that started it: stdin closed.
  process.stdin.on("end", () => process.exit(0));
  process.stdin.resume();
}

if (process.argv.includes("--http")) {
  serveHttp();
} else {
  const lines = createInterface({ input: process.stdin });
  lines.on("line", (line) => {
    if (!line.trim()) return;
    const reply = handle(line);
    if (reply !== null) process.stdout.write(JSON.stringify(reply) + "\n");
  });
  lines.on("close", () => process.exit(0));
}
