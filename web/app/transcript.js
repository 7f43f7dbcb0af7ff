// One session's transcript: the canonical events of docs/protocol.md ("Event reference")
// rendered into the DOM. Brackets arrive from history pages (older pages are prepended as the
// user scrolls back) and live pushes, in any order and possibly twice: each is placed by its
// sequence_id and rendered once. Deltas stream into the block their bracket opened. Kinds
// this page does not know are skipped, as the protocol asks.

import { marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";

const Diff = globalThis.Diff; // vendor/diff.min.js, a classic script loaded before this module

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "tabindex" || k === "type" || k === "title")
      el.setAttribute(k, v === true ? "" : String(v));
    else el[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    el.append(c);
  }
  return el;
}

// What an agent writes is data: its markdown may hold raw HTML. No script survives DOMPurify;
// on top of that, nothing that could pose as the page's own controls does (a `<textarea
// id="prompt">` would otherwise shadow the prompt box), and no element may take an id or name.
const SANITIZE = {
  FORBID_TAGS: ["form", "input", "textarea", "select", "option", "button", "dialog", "style", "link", "meta", "base", "iframe", "object", "embed"],
  FORBID_ATTR: ["id", "name", "form", "formaction", "style", "autofocus", "tabindex"],
  SANITIZE_NAMED_PROPS: true,
};

/** Markdown → sanitized HTML, into `el`. */
export function renderMarkdown(el, text) {
  el.innerHTML = DOMPurify.sanitize(marked.parse(text || "", { gfm: true, async: false }), SANITIZE);
}

function pretty(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** One line saying what a tool call does, for its summary. */
function toolSummary(name, input) {
  if (!input || typeof input !== "object") return typeof input === "string" ? input.slice(0, 120) : "";
  const pick = input.command ?? input.cmd ?? input.file_path ?? input.path ?? input.pattern ?? input.url ?? input.query ?? input.description;
  if (Array.isArray(pick)) return pick.join(" ");
  return pick === undefined ? "" : String(pick).split("\n")[0].slice(0, 160);
}

/** A diff of old and new text, line by line. */
function diffBlock(oldText, newText, label) {
  const pre = h("pre", { class: "diff", "aria-label": label ? `Changes to ${label}` : "Changes" });
  const parts = Diff ? Diff.diffLines(oldText || "", newText || "") : [{ removed: true, value: oldText || "" }, { added: true, value: newText || "" }];
  for (const part of parts) {
    const cls = part.added ? "add" : part.removed ? "del" : "ctx";
    const mark = part.added ? "+" : part.removed ? "-" : " ";
    const lines = part.value.replace(/\n$/, "").split("\n");
    for (const line of lines) pre.append(h("span", { class: cls, text: `${mark} ${line}\n` }));
  }
  return pre;
}

/** A unified patch text (Codex apply_patch, a git diff) with its lines marked. */
function patchBlock(patch) {
  const pre = h("pre", { class: "diff", "aria-label": "Patch" });
  for (const line of String(patch).split("\n")) {
    const cls = line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") || line.startsWith("***") ? "hunk" : "ctx";
    pre.append(h("span", { class: cls, text: `${line}\n` }));
  }
  return pre;
}

/** File edits as diffs, where the agent gives them; null when the input is not an edit. */
function editView(name, input) {
  if (!input || typeof input !== "object") return null;
  const file = input.file_path || input.path || input.filePath;
  if (typeof input.old_string === "string" && typeof input.new_string === "string") return diffBlock(input.old_string, input.new_string, file);
  if (typeof input.oldText === "string" && typeof input.newText === "string") return diffBlock(input.oldText, input.newText, file);
  if (Array.isArray(input.edits) && input.edits.every((e) => e && typeof e.old_string === "string")) {
    const wrap = h("div", { class: "edits" });
    for (const e of input.edits) wrap.append(diffBlock(e.old_string, e.new_string, file));
    return wrap;
  }
  if (/^(Write|write|write_file|create_file)$/.test(name) && typeof input.content === "string") return diffBlock("", input.content, file);
  if (typeof input.patch === "string") return patchBlock(input.patch);
  return null;
}

/** Who answered a permission request, for a person. */
export function answeredBy(by, own) {
  if (!by) return "";
  if (by === own) return "answered here";
  if (by === "ipc") return "answered from the terminal";
  if (by === "relay") return "answered from the relay (a remote client)";
  if (by === "host") return "by the host (the run or the agent ended)";
  if (by === "agent") return "by the agent";
  return `answered from another client (${by.slice(0, 8)})`;
}

/** Who sent a prompt (`user.text`'s and a queued prompt's `from`), for a person; "" unknown. */
export function promptFrom(from, own) {
  if (!from || typeof from !== "object") return "";
  if (from.via === "ipc") return "from the terminal";
  if (from.via === "relay") return "from the relay";
  if (from.subscriberId && from.subscriberId === own) return "from this page";
  if (from.client === "follow") return "from agent-host follow";
  if (from.client === "web") return "from another browser page";
  return from.client ? `from ${from.client}` : "from another client";
}

const DECISIONS = { allow: "Allowed", deny: "Denied", expired: "Expired", withdrawn: "Withdrawn" };
const OPTION_LABELS = { allow: "Allow once", allow_always: "Allow always", deny: "Deny" };
// The key that answers with the first option of each kind.
const OPTION_KEYS = { allow_once: "y", reject_once: "n", allow_always: "a" };

/** A request's options as {id, label, kind}; history from older hosts holds bare ids. */
export function permissionOptions(options) {
  const list = Array.isArray(options) && options.length ? options : ["allow", "deny"];
  return list.map((o) => {
    if (o && typeof o === "object") return { id: String(o.id), label: o.label || String(o.id), kind: o.kind || "allow_once", rule: o.rule };
    const id = String(o);
    const kind = id === "allow_always" ? "allow_always" : /^(deny|reject)/.test(id) ? "reject_once" : "allow_once";
    return { id, label: OPTION_LABELS[id] || id, kind };
  });
}

/** The block a delta streams into — `text|thinking:<run>:<itemId>` or `tool:<callId>` — or
 * null for a delta whose stream the page does not show. */
export function streamKey({ runId, event }) {
  const run = runId || event.runId || "";
  if (event.k === "text.delta" || event.k === "thinking.delta") return `${event.k.split(".")[0]}:${run}:${event.itemId || ""}`;
  if (event.k === "tool.exec.update") return `tool:${event.callId}`;
  return null;
}

export class Transcript {
  constructor(sessionId, hooks) {
    this.sessionId = sessionId;
    // {respond(sessionId, requestId, optionId), openSession(id), own(), streamed(sessionId, key)}
    this.hooks = hooks;
    this.seen = new Set(); // bracket sequence ids rendered
    this.anchors = []; // [seq, node] sorted by seq: where the next node goes
    this.blocks = new Map(); // "tool:callId" | "perm:requestId" → record
    this.open = new Map(); // "text|thinking:run:item" → the block still streaming
    this.orphans = []; // ends rendered before their start's page was loaded
    this.resolvedEarly = new Map(); // requestId → its permission.resolved, seen before the request
    this.oldest = null; // the oldest history page's start (next_before_seq)
    this.hasOlder = true;
    this.loadedOnce = false;
    this.el = h("div", { class: "transcript-body" });
    this.top = h("div", { class: "older" });
    this.el.append(this.top);
  }

  /** The rendered brackets' sequence ids, ascending. */
  seqs() {
    return [...this.seen].sort((a, b) => a - b);
  }

  place(seq, node) {
    let lo = 0;
    let hi = this.anchors.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.anchors[mid][0] < seq) lo = mid + 1;
      else hi = mid;
    }
    const next = this.anchors[lo];
    if (next) this.el.insertBefore(node, next[1]);
    else this.el.append(node);
    this.anchors.splice(lo, 0, [seq, node]);
  }

  /** Brackets, each `{seq, runId, event}`; those seen already are skipped. `live`: pushed
   * now (a new permission request may take the focus), not a history page. */
  add(entries, live = false) {
    const fresh = entries.filter((e) => !this.seen.has(e.seq)).sort((a, b) => a.seq - b.seq);
    this.live = live;
    for (const e of fresh) {
      this.seen.add(e.seq);
      try {
        this.bracket(e);
      } catch (err) {
        console.error("could not render", e.event && e.event.k, err);
      }
    }
    return fresh.length;
  }

  bracket({ seq, runId, event }) {
    const k = event.k;
    const run = runId || event.runId || "";
    switch (k) {
      case "user.text": {
        // A steer is more input for the running turn, not a prompt of its own.
        // An imported prompt is the agent's own from before the import (no run of the host's).
        const cls = event.steer ? "user steer" : event.imported ? "user imported" : "user";
        const who = event.imported ? "Prompt · imported" : event.steer ? "Steer (into the running turn)" : "Prompt";
        const node = h("div", { class: cls, "data-seq": seq, "data-run": run },
          h("div", { class: "who", text: [who, promptFrom(event.from, this.hooks.own())].filter(Boolean).join(" · ") }),
          h("div", { class: "body", text: event.text || "" }));
        this.place(seq, node);
        break;
      }
      case "text.start":
      case "thinking.start": {
        this.blockStart(k.startsWith("text") ? "text" : "thinking", run, event.itemId, seq);
        break;
      }
      case "text.end":
      case "thinking.end": {
        const kind = k.startsWith("text") ? "text" : "thinking";
        const b = this.blockEnd(kind, run, event.itemId, seq);
        if (kind === "text") renderMarkdown(b.content, event.text);
        else b.content.textContent = event.text || "";
        if (event.truncated) b.node.append(h("p", { class: "truncated", text: `cut: ${event.truncated.keptBytes} of ${event.truncated.fullBytes} bytes` }));
        if (event.imported && !b.node.classList.contains("imported")) {
          b.node.classList.add("imported");
          b.node.prepend(h("div", { class: "imported-mark", text: "imported" }));
        }
        break;
      }
      case "tool.call.start":
      case "tool.call.end":
      case "tool.exec.start":
      case "tool.exec.end": {
        const t = this.toolCard(event.callId, event.name, seq);
        if (event.name && !t.name) t.setName(event.name);
        if (k === "tool.call.end") t.setInput(event.input);
        if (k === "tool.exec.start") t.setStatus("running");
        if (k === "tool.exec.end") t.setOutput(event.output, event.isError, event.exitCode);
        break;
      }
      case "permission.request": {
        this.permissionCard(event, seq);
        break;
      }
      case "permission.resolved": {
        const p = this.blocks.get(`perm:${event.requestId}`);
        if (p) p.resolve(event.decision, event.by, event);
        // Paging back: its request is in an older page, and is shown resolved when it comes.
        else this.resolvedEarly.set(event.requestId, event);
        break;
      }
      case "usage": {
        const parts = [`in ${event.inputTokens ?? 0}`, `out ${event.outputTokens ?? 0}`];
        if (event.cachedInputTokens) parts.push(`cached ${event.cachedInputTokens}`);
        if (event.costUsd !== undefined && event.costUsd !== null) parts.push(`$${Number(event.costUsd).toFixed(4)}`);
        this.place(seq, h("div", { class: "usage", "data-seq": seq, text: `tokens: ${parts.join(" · ")}` }));
        break;
      }
      case "run.end": {
        const state = event.state || "completed";
        let text = state;
        if (event.category) text += ` · ${event.category}`;
        if (event.message) text += ` — ${event.message}`;
        this.place(seq, h("div", { class: "run-end", "data-seq": seq, "data-state": state, "data-run": run, role: "note", text }));
        for (const [key, b] of this.open) {
          if (b.run === run) {
            b.node.classList.remove("streaming");
            this.open.delete(key);
          }
        }
        break;
      }
      case "warning": {
        this.place(seq, h("div", { class: "notice warning", "data-seq": seq, "data-code": event.code, role: "note", text: `${event.message} (${event.code})` }));
        break;
      }
      case "error": {
        this.place(seq, h("div", { class: "notice error", "data-seq": seq, "data-category": event.category, role: "note", text: `${event.category}: ${event.message}` }));
        break;
      }
      case "session.forked": {
        const other = event.childSessionId && event.childSessionId !== this.sessionId ? event.childSessionId : event.parentSessionId !== this.sessionId ? event.parentSessionId : null;
        const label = event.childSessionId && event.childSessionId !== this.sessionId ? "Forked into " : "Forked from ";
        const node = h("div", { class: "notice fork", "data-seq": seq }, label);
        if (other) {
          const b = h("button", { type: "button", class: "link", text: other.slice(0, 8) });
          b.addEventListener("click", () => this.hooks.openSession(other));
          node.append(b);
        }
        if (event.reason) node.append(` (${event.reason})`);
        this.place(seq, node);
        break;
      }
      default:
        // run.start, session.state, session.bound and kinds this page does not know: no node.
        break;
    }
  }

  newBlock(kind, run, seq) {
    let node;
    let content;
    if (kind === "thinking") {
      content = h("div", { class: "thinking-text" });
      node = h("details", { class: "thinking streaming", "data-seq": seq, "data-run": run }, h("summary", { text: "Thinking" }), content);
    } else {
      content = h("div", { class: "md" });
      node = h("div", { class: "text streaming", "data-seq": seq, "data-run": run }, content);
    }
    return { kind, run, node, content, streamed: "" };
  }

  /** A `*.start`: a new open block — or, paging back, the start of a block whose end a newer
   * page already rendered. */
  blockStart(kind, run, itemId, seq) {
    const key = `${kind}:${run}:${itemId || ""}`;
    const i = this.orphans.findIndex((o) => o.key === key && o.endSeq > seq);
    if (i >= 0) {
      this.orphans.splice(i, 1);
      return;
    }
    const streaming = this.open.get(key);
    if (streaming && !streaming.node.dataset.seq) {
      // Deltas came first (live, before the page holding this start arrived): that block.
      streaming.node.dataset.seq = seq;
      this.place(seq, streaming.node);
      return;
    }
    const b = this.newBlock(kind, run, seq);
    this.open.set(key, b);
    this.place(seq, b.node);
    // What this connection streamed of it already (a page that joined mid-block).
    const soFar = this.hooks.streamed?.(this.sessionId, key);
    if (soFar) this.stream(b, soFar);
  }

  stream(b, text) {
    b.streamed = text;
    b.content.textContent = text;
  }

  /** Every open block shows what the connection streamed of it (after the first page). */
  syncStreams() {
    for (const [key, b] of this.open) {
      const text = this.hooks.streamed?.(this.sessionId, key);
      if (text) this.stream(b, text);
    }
    for (const [key, t] of this.blocks) {
      const text = t.streamOutput && this.hooks.streamed?.(this.sessionId, key);
      if (text) t.streamOutput(text);
    }
  }

  /** A `*.end`: closes the open block of its item, or stands alone when its start is in a page
   * not loaded yet. */
  blockEnd(kind, run, itemId, seq) {
    const key = `${kind}:${run}:${itemId || ""}`;
    let b = this.open.get(key);
    if (b) this.open.delete(key);
    else {
      b = this.newBlock(kind, run, seq);
      this.orphans.push({ key, endSeq: seq });
      this.place(seq, b.node);
    }
    b.node.classList.remove("streaming");
    b.node.dataset.endSeq = seq;
    return b;
  }

  toolCard(callId, name, seq) {
    const key = `tool:${callId}`;
    let t = this.blocks.get(key);
    if (t) return t;
    const title = h("span", { class: "tool-name", text: name || "tool" });
    const summary = h("span", { class: "tool-summary" });
    const status = h("span", { class: "tool-status", text: "…" });
    const body = h("div", { class: "tool-body" });
    const node = h("details", { class: "tool", "data-seq": seq, "data-call-id": callId, open: true },
      h("summary", {}, title, " ", summary, " ", status), body);
    const inputBox = h("div", { class: "tool-input" });
    const outputBox = h("pre", { class: "tool-output", "aria-label": "Output" });
    body.append(inputBox, outputBox);
    t = {
      node,
      name,
      run: null,
      setName: (n) => {
        t.name = n;
        title.textContent = n;
      },
      setInput: (input) => {
        summary.textContent = toolSummary(t.name, input);
        inputBox.replaceChildren();
        const edit = editView(t.name || "", input);
        if (edit) inputBox.append(edit);
        else inputBox.append(h("pre", { class: "json", "aria-label": "Input", text: pretty(input) }));
      },
      setStatus: (s) => {
        status.textContent = s;
        node.dataset.status = s;
      },
      ended: false,
      // The output streamed so far (not after the end, which has it whole).
      streamOutput: (text) => {
        if (!t.ended) outputBox.textContent = text;
      },
      setOutput: (output, isError, exitCode) => {
        t.ended = true;
        outputBox.textContent = output || "";
        const s = isError ? (exitCode !== undefined && exitCode !== null ? `error (exit ${exitCode})` : "error") : "done";
        t.setStatus(s);
        node.classList.toggle("failed", !!isError);
      },
    };
    this.blocks.set(key, t);
    this.place(seq, node);
    const soFar = this.hooks.streamed?.(this.sessionId, key);
    if (soFar) t.streamOutput(soFar);
    return t;
  }

  permissionCard(event, seq) {
    const key = `perm:${event.requestId}`;
    if (this.blocks.has(key)) return;
    const options = permissionOptions(event.options);
    const choices = h("div", { class: "choices" });
    const outcome = h("p", { class: "outcome", role: "status" });
    const node = h("section", { class: "permission pending", tabindex: "0", "data-seq": seq, "data-request-id": event.requestId, "aria-label": `Permission request: ${event.tool}` },
      h("h3", { text: `${event.tool} asks for permission` }),
      editView(event.tool, event.input) || h("pre", { class: "json", text: pretty(event.input) }),
      choices,
      outcome);
    const buttons = [];
    // The first option of each kind has a key: y allow once, n deny, a allow always.
    const keyed = new Map();
    for (const option of options) {
      const key = OPTION_KEYS[option.kind];
      if (key && !keyed.has(key)) keyed.set(key, option);
    }
    for (const option of options) {
      const key = [...keyed].find(([, o]) => o === option)?.[0];
      const b = h("button", {
        type: "button",
        class: `choice ${option.kind}`,
        "data-option-id": option.id,
        "data-kind": option.kind,
        "data-decision": option.kind.startsWith("allow") ? "allow" : "deny",
        title: option.rule || option.label,
        text: `${option.label}${key ? ` (${key})` : ""}`,
      });
      b.addEventListener("click", () => answer(option));
      buttons.push(b);
      choices.append(b);
    }
    let answering = false;
    const answer = async (option) => {
      if (answering || !node.classList.contains("pending")) return;
      answering = true;
      for (const b of buttons) b.disabled = true;
      outcome.textContent = "Sending…";
      const err = await this.hooks.respond(this.sessionId, event.requestId, option.id);
      answering = false;
      if (err && node.classList.contains("pending")) {
        outcome.textContent = err;
        for (const b of buttons) b.disabled = false;
      }
    };
    node.addEventListener("keydown", (ev) => {
      if (!node.classList.contains("pending") || ev.target.tagName === "TEXTAREA" || ev.target.tagName === "INPUT") return;
      const option = !ev.ctrlKey && !ev.metaKey && !ev.altKey && keyed.get(ev.key);
      if (option) {
        ev.preventDefault();
        answer(option);
      }
    });
    const p = {
      node,
      pending: true,
      resolve: (decision, by, resolved = {}) => {
        p.pending = false;
        node.classList.remove("pending");
        node.classList.add("resolved");
        node.dataset.decision = decision;
        if (resolved.kind) node.dataset.kind = resolved.kind;
        choices.remove();
        const who = answeredBy(by, this.hooks.own());
        const chosen = options.find((o) => o.id === resolved.optionId);
        let text = DECISIONS[decision] || decision;
        if (resolved.kind === "allow_always") text = "Allowed always";
        else if (chosen && chosen.label && !["allow", "deny"].includes(chosen.id)) text += ` (${chosen.label})`;
        outcome.textContent = `${text}${who ? ` — ${who}` : ""}`;
        if (resolved.rule) outcome.append(h("span", { class: "rule", text: ` · rule kept: ${resolved.rule}` }));
      },
    };
    this.blocks.set(key, p);
    this.place(seq, node);
    const early = this.resolvedEarly.get(event.requestId);
    if (early) {
      this.resolvedEarly.delete(event.requestId);
      p.resolve(early.decision, early.by, early);
    } else if (this.live) {
      this.hooks.changed?.(node);
    }
  }

  /** The permission requests still waiting for an answer, oldest first. */
  pendingPermissions() {
    return [...this.blocks.values()].filter((b) => b.pending).map((b) => b.node);
  }

  /** A delta push: its block shows `full`, the block's text so far on this connection (the
   * host starts a new connection's stream of an open block from the block's start, so the
   * page never appends across connections). A block whose start this page never saw is made. */
  delta(push, full) {
    const { event } = push;
    const key = streamKey(push);
    if (!key) return;
    const text = full ?? event.text ?? event.output ?? "";
    if (event.k === "tool.exec.update") {
      const t = this.blocks.get(key);
      if (t && t.streamOutput) t.streamOutput(text);
      return;
    }
    let b = this.open.get(key);
    if (!b) {
      // Its start is not rendered (this page joined mid-block): stream it at the end.
      b = this.newBlock(event.k.split(".")[0], push.runId || event.runId || "", "");
      this.open.set(key, b);
      this.el.append(b.node);
    }
    this.stream(b, text);
  }
}
