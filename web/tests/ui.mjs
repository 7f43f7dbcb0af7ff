// The web UI in a real browser (Debian's chromium driven by playwright-core), against a real
// host running the real `claude` on the project's mock model. Run by tests/suite/web_ui.rs, which
// sets up the host and passes (env): AH_BIN, AH_HOME, AH_WORKDIR, AH_BIG_SESSION,
// AH_BIG_COUNT, AH_SHOTS, AH_RESULTS, AH_CHROMIUM, AH_CHROMIUM_ARGS. Each step prints `ok …`;
// the first failure throws (exit 1). The results file gets every grant token seen (the Rust
// side checks none is in logs/) and the measured figures.

import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import { writeFileSync, mkdirSync, readdirSync, readFileSync } from "node:fs";
import http from "node:http";
import path from "node:path";

const env = process.env;
const need = (k) => {
  if (!env[k]) throw new Error(`${k} is not set`);
  return env[k];
};
const BIN = need("AH_BIN");
const WORKDIR = need("AH_WORKDIR");
const BIG = need("AH_BIG_SESSION");
const BIG_COUNT = Number(need("AH_BIG_COUNT"));
const SHOTS = need("AH_SHOTS");
const RESULTS = need("AH_RESULTS");
const TURN = 90_000;

mkdirSync(SHOTS, { recursive: true });
const tokens = new Set();
const figures = {};

function ah(args) {
  return execFileSync(BIN, args, { env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 30 });
}
/** The reply of a command that may fail (exit status 1 with its JSON line). */
function ahReply(command, params) {
  let out;
  try {
    out = ah([command, JSON.stringify(params ?? {})]);
  } catch (e) {
    out = String(e.stdout || "");
  }
  return JSON.parse(out.trim().split("\n").pop());
}
function ahJson(command, params) {
  const out = ah([command, JSON.stringify(params ?? {})]);
  const reply = JSON.parse(out.trim().split("\n").pop());
  if (reply.code !== 0) throw new Error(`${command}: ${out}`);
  return reply.data;
}
function openUrl(session) {
  const out = ah(session ? ["open", session, "--print"] : ["open", "--print"]).trim().split("\n")[0];
  const url = new URL(out);
  if (url.hostname !== "127.0.0.1" || url.pathname !== "/") throw new Error(`open printed ${out}`);
  const token = new URLSearchParams(url.hash.slice(1)).get("token");
  if (!token) throw new Error(`no token in the fragment of ${out}`);
  tokens.add(token);
  return out;
}
/** Load the page from a new link as a new document (a link that differs only in its fragment
 * would otherwise be a same-document navigation, racing the page's own reload). */
async function visit(page, url) {
  await page.goto("about:blank");
  await page.goto(url);
}
function check(cond, what) {
  if (!cond) throw new Error(what);
}
function ok(what) {
  console.log(`ok ${what}`);
}
/** Every bracket of a session over IPC, ascending. */
function historySeqs(session) {
  const events = [];
  let after = 0;
  for (;;) {
    const page = ahJson("session.history", { session_id: session, after_seq: after, limit: 5000 });
    events.push(...page.events);
    if (!page.has_more) return { seqs: events.map((e) => e.sequence_id), events };
    after = page.next_after_seq;
  }
}
async function tokensOf(page) {
  const t = await page.evaluate(() => sessionStorage.getItem("agent-host.token"));
  if (t) tokens.add(t);
}
async function live(page) {
  await page.waitForSelector('#conn[data-state="live"]', { timeout: 30_000 });
}
/** Brackets the page rendered for `session`, ascending. */
async function pageSeqs(page, session) {
  return page.evaluate((id) => {
    const t = window.agentHost.transcripts.get(id);
    return t ? t.seqs() : null;
  }, session);
}
/** The page shows exactly the session's stored brackets, once each, in order (polled: the
 * host may still be publishing the run's last brackets). */
async function sameAsStore(page, session, what) {
  let shown = [];
  let stored = [];
  for (let i = 0; i < 20; i++) {
    stored = historySeqs(session).seqs;
    await page.waitForFunction(
      ([id, n]) => (window.agentHost.transcripts.get(id)?.seqs().length || 0) >= n,
      [session, stored.length],
    );
    shown = await pageSeqs(page, session);
    if (JSON.stringify(shown) === JSON.stringify(historySeqs(session).seqs)) return;
  }
  throw new Error(`${what}: the page has ${shown.length} brackets, the store ${stored.length}`);
}
async function runEnds(page, state) {
  return page.locator(`#transcript .run-end[data-state="${state}"]`).count();
}
async function waitRunEnds(page, state, count) {
  await page.waitForFunction(
    ([s, n]) => document.querySelectorAll(`#transcript .run-end[data-state="${s}"]`).length >= n,
    [state, count],
    { timeout: TURN },
  );
}
async function send(page, text) {
  await page.fill("#prompt", text);
  await page.press("#prompt", "Enter");
}
/** The texts of the queue panel, head first. */
async function panel(page) {
  return page.$$eval("#queue .queue-item .queue-text", (xs) => xs.map((x) => x.textContent));
}
async function waitPanel(page, texts, what) {
  try {
    await page.waitForFunction((want) => JSON.stringify([...document.querySelectorAll("#queue .queue-item .queue-text")].map((x) => x.textContent)) === want, JSON.stringify(texts));
  } catch (e) {
    throw new Error(`${what}: the queue panel shows ${JSON.stringify(await panel(page))}, not ${JSON.stringify(texts)} (${e.message})`);
  }
}
/** The session's queue over IPC, head first. */
function ipcQueue(session) {
  return ahJson("session.get", { session_id: session }).queue.map((q) => q.text);
}
/** The queued prompt of the panel whose text is `text`. */
function queued(page, text) {
  return page.locator("#queue .queue-item").filter({ has: page.locator(".queue-text", { hasText: new RegExp(`^${text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}$`) }) });
}
/** Hold the page's next reconnect until `window.reopen()`, and drop its connection. */
async function dropConnection(page) {
  await page.evaluate(() => {
    const w = window.agentHost.wire;
    const open = w.open.bind(w);
    w.open = () => {
      window.reopen = () => {
        w.open = open;
        open();
      };
    };
    w.ws.close();
  });
  await page.waitForSelector('#conn[data-state="reconnecting"]');
}
/** Record, for every text block of the page, the text it showed streaming last (before its
 * end rendered it whole), by the block's start seq. */
async function recordStreams(page) {
  await page.evaluate(() => {
    window.streamedTexts = new Map();
    new MutationObserver(() => {
      for (const el of document.querySelectorAll("#transcript .text.streaming")) {
        window.streamedTexts.set(el.dataset.seq, el.querySelector(".md").textContent);
      }
    }).observe(document.getElementById("transcript"), { subtree: true, childList: true, characterData: true });
  });
}

const browser = await chromium.launch({
  executablePath: need("AH_CHROMIUM"),
  args: (env.AH_CHROMIUM_ARGS || "").split(" ").filter(Boolean),
  headless: true,
});
const contextA = await browser.newContext({ viewport: { width: 1280, height: 860 } });
const a = await contextA.newPage();
a.setDefaultTimeout(60_000);
const consoleErrors = [];
// Errors of the page's own code. Chromium also logs as console errors: each refused
// WebSocket handshake and failed load (expected while the host is killed and restarted), and
// the CSP refusing the inline handler of agent HTML the test sends on purpose — Chromium
// reports it as DOMPurify parses the markup in an inert document; the handler never runs and
// never reaches the page, which the test checks in the DOM.
a.on("console", (m) => {
  const text = m.text();
  const expected = /WebSocket connection to|Failed to load resource|ERR_CONNECTION_REFUSED|Executing inline event handler violates the following Content Security Policy/;
  if (m.type() === "error" && !expected.test(text)) consoleErrors.push(text);
});
a.on("pageerror", (e) => consoleErrors.push(String(e)));

/** What a failure report shows: the session the scenario drives (once created). */
const failing = { session: null };
/** On a failure, what the store, the page and the host's log say, so that a failure seen once
 * (e.g. on a loaded CI machine) can be read from its output alone. */
async function failureReport() {
  const lines = ["---- failure report ----"];
  const guard = async (what, f) => {
    try {
      await f();
    } catch (e) {
      lines.push(`(${what}: ${String(e.message || e).split("\n")[0]})`);
    }
  };
  if (failing.session) {
    await guard("session.get", async () => {
      const s = ahJson("session.get", { session_id: failing.session });
      lines.push(`session ${failing.session}: state ${s.state}, queue ${JSON.stringify((s.queue || []).map((q) => q.text))}`);
    });
    await guard("session.history", async () => {
      const { events } = historySeqs(failing.session);
      lines.push(`its last ${Math.min(events.length, 40)} of ${events.length} stored brackets:`);
      for (const e of events.slice(-40)) lines.push(`  ${e.sequence_id} ${e.kind} ${JSON.stringify(e.event).slice(0, 160)}`);
    });
  }
  await guard("page A", async () => {
    const shown = await a.evaluate(() => ({
      conn: document.getElementById("conn")?.dataset.state,
      state: document.getElementById("session-state")?.textContent,
      prompt: document.getElementById("prompt")?.value,
      composer: document.getElementById("composer-status")?.textContent,
      transcript: (document.getElementById("transcript")?.innerText || "").slice(-1500),
    }));
    lines.push(`page A: connection ${shown.conn}, state ${JSON.stringify(shown.state)}, prompt box ${JSON.stringify(shown.prompt)}, composer status ${JSON.stringify(shown.composer)}`);
    lines.push(`page A's transcript, its end:\n${shown.transcript}`);
  });
  await guard("host log", async () => {
    const dir = path.join(need("AH_HOME"), "logs");
    for (const f of readdirSync(dir).sort()) {
      const text = readFileSync(path.join(dir, f), "utf8").split("\n");
      lines.push(`${f}, its last ${Math.min(text.length, 60)} lines:`);
      lines.push(...text.slice(-60).map((l) => `  ${l.slice(0, 300)}`));
    }
  });
  console.error(lines.join("\n"));
}

try {
  // ---- 1. open, list, create, prompt: streamed token by token, then markdown ----------
  const firstLink = openUrl();
  await visit(a, firstLink);
  await live(a);
  check(!(await a.evaluate(() => location.href)).includes("token="), "the token stayed in the address bar");
  // Once live, the page renews its own grant over the wire: the token it keeps for a reload
  // is a new one, not the link's (link tokens are short-lived).
  const linkToken = new URLSearchParams(new URL(firstLink).hash.slice(1)).get("token");
  await a.waitForFunction((t) => {
    const kept = sessionStorage.getItem("agent-host.token");
    return kept !== null && kept !== t;
  }, linkToken);
  await tokensOf(a);
  await a.waitForSelector(`.session-row[data-session-id="${BIG}"]`);
  await a.screenshot({ path: path.join(SHOTS, "session-list.png") });
  ok("the page loads over the grant and lists the sessions");

  await a.click("#new-session");
  await a.waitForSelector("#new-dialog[open]");
  await a.waitForSelector('#new-agent option[value="claude"]:not([disabled])', { state: "attached" });
  await a.selectOption("#new-agent", "claude");
  await a.fill("#new-cwd", WORKDIR);
  await a.fill("#new-title", "browser test");
  await a.click("#new-create");
  await a.waitForFunction(() => document.getElementById("session-title").textContent === "browser test");
  const session = await a.evaluate(() => window.agentHost.current);
  failing.session = session;
  check(session && session !== "", "no session opened after create");
  await a.waitForSelector(`.session-row[data-session-id="${session}"]`);
  ok("a session is created from the page");

  // Shift+Enter is a newline in the prompt box; only Enter sends.
  await a.fill("#prompt", "line one");
  await a.press("#prompt", "Shift+Enter");
  await a.type("#prompt", "line two");
  const drafted = await a.inputValue("#prompt");
  check(drafted === "line one\nline two", `Shift+Enter left ${JSON.stringify(drafted)} in the prompt box`);
  check((await a.locator("#transcript .user").count()) === 0, "Shift+Enter sent the prompt");
  await a.fill("#prompt", "");

  await a.evaluate(() => {
    window.partials = [];
    new MutationObserver(() => {
      const el = document.querySelector("#transcript .text.streaming .md");
      if (el) {
        const n = el.textContent.length;
        if (window.partials[window.partials.length - 1] !== n) window.partials.push(n);
      }
    }).observe(document.getElementById("transcript"), { subtree: true, childList: true, characterData: true });
  });
  await send(a, "MARKDOWN please");
  await a.waitForFunction(() => window.partials.length >= 2, null, { timeout: TURN });
  await a.screenshot({ path: path.join(SHOTS, "streaming-turn.png") });
  await waitRunEnds(a, "completed", 1);
  const partials = await a.evaluate(() => window.partials);
  check(partials.length >= 3, `the answer did not stream: partial lengths ${JSON.stringify(partials)}`);
  check(partials.every((n, i) => i === 0 || n > partials[i - 1]), `partials not growing: ${partials}`);
  const md = await a.evaluate(() => {
    const blocks = [...document.querySelectorAll("#transcript .text:not(.streaming)")];
    const last = blocks[blocks.length - 1];
    return {
      h2: last?.querySelector("h2")?.textContent,
      strong: last?.querySelector("strong")?.textContent,
      code: last?.querySelector("pre code")?.textContent,
      items: last ? last.querySelectorAll("li").length : 0,
    };
  });
  check(md.h2 === "Result" && md.strong === "bold" && (md.code || "").includes("fn main") && md.items === 2, `not rendered as markdown: ${JSON.stringify(md)}`);
  ok(`the answer streamed in ${partials.length} steps, then rendered as markdown`);

  // ---- 2. a permission approved in A; B sees who answered; the output in both ---------
  const contextB = await browser.newContext({ viewport: { width: 1100, height: 800 } });
  const b = await contextB.newPage();
  b.setDefaultTimeout(60_000);
  await visit(b, openUrl(session));
  await live(b);
  await b.waitForFunction((id) => window.agentHost.current === id && window.agentHost.transcripts.get(id)?.loadedOnce, session);
  await send(a, "TOOLCALL `touch tool-a && echo tool-output-42`");
  await a.waitForSelector("#transcript .permission.pending", { timeout: TURN });
  await b.waitForSelector("#transcript .permission.pending", { timeout: TURN });
  await a.waitForSelector('.session-row[data-state="waiting"] .badge.state-waiting');
  check((await a.textContent("#session-state")) === "needs you", "the session is not shown as needing you");
  // The agent's own choices are the buttons; the first of each kind has its key.
  const choices = await a.$$eval("#transcript .permission.pending button", (bs) => bs.map((b) => ({ kind: b.dataset.kind, text: b.textContent })));
  check(choices.some((c) => c.kind === "allow_once" && c.text.endsWith("(y)"))
    && choices.some((c) => c.kind === "allow_always" && c.text.endsWith("(a)"))
    && choices.some((c) => c.kind === "reject_once" && c.text.endsWith("(n)")), `the choices are ${JSON.stringify(choices)}`);
  await a.screenshot({ path: path.join(SHOTS, "permission-prompt.png") });
  // By keyboard: the card is focused when it arrives (or focus it), y allows.
  await a.focus("#transcript .permission.pending");
  await a.keyboard.press("y");
  await a.waitForSelector("#transcript .permission.resolved");
  await b.waitForSelector("#transcript .permission.resolved");
  const outcomeA = await a.textContent("#transcript .permission.resolved .outcome");
  const outcomeB = await b.textContent("#transcript .permission.resolved .outcome");
  check(/Allowed/.test(outcomeA) && /answered here/.test(outcomeA), `A shows ${outcomeA}`);
  check(/Allowed/.test(outcomeB) && /answered from another client/.test(outcomeB), `B shows ${outcomeB}`);
  for (const p of [a, b]) {
    await p.waitForFunction(() => [...document.querySelectorAll("#transcript .tool-output")].some((o) => o.textContent.includes("tool-output-42")), null, { timeout: TURN });
  }
  await waitRunEnds(a, "completed", 2);
  ok(`approved in A (${outcomeA}); B shows "${outcomeB}"; the tool output is in both`);

  // Answered from the terminal: every page says so.
  await send(a, "TOOLCALL `touch tool-b && echo from-the-terminal`");
  await b.waitForSelector("#transcript .permission.pending", { timeout: TURN });
  const requestId = await b.getAttribute("#transcript .permission.pending", "data-request-id");
  ahJson("permission.respond", { session_id: session, request_id: requestId, decision: "allow" });
  for (const p of [a, b]) {
    await p.waitForFunction((id) => {
      const card = document.querySelector(`#transcript .permission[data-request-id="${CSS.escape(id)}"]`);
      return card && /answered from the terminal/.test(card.textContent);
    }, requestId);
  }
  await waitRunEnds(a, "completed", 3);
  ok("a permission answered from the terminal shows so on both pages");

  // A failed run shows its state and error category.
  await send(a, "FAIL429 now");
  await waitRunEnds(a, "failed", 1);
  const failed = await a.textContent('#transcript .run-end[data-state="failed"]');
  check(/rate_limited/.test(failed), `the failed run's end says ${failed}`);
  check((await a.locator("#transcript .usage").count()) >= 3, "no token usage shown");
  ok(`a failed run shows "${failed}"; usage is shown`);

  // ---- 3. cancel from the page; the next prompt works --------------------------------
  await send(a, "SLOW story");
  await a.waitForFunction(() => (document.querySelector("#transcript .text.streaming .md")?.textContent.length || 0) > 5, null, { timeout: TURN });
  await a.waitForSelector("#cancel:not([disabled])");
  await a.keyboard.press("Escape");
  await waitRunEnds(a, "cancelled", 1);
  // The echo carries raw HTML back as agent output: it must not become page controls.
  await send(a, 'THINK after the cancel <textarea id="prompt">evil</textarea><dialog open>fake</dialog><img src=x onerror="document.title=1">');
  await waitRunEnds(a, "completed", 4);
  check((await a.textContent("#transcript")).includes("after the cancel"), "the prompt after the cancel got no answer");
  const thinking = await a.evaluate(() => {
    const t = [...document.querySelectorAll("#transcript details.thinking")].pop();
    return t ? { open: t.open, text: t.textContent } : null;
  });
  check(thinking && !thinking.open && /think about it/.test(thinking.text), `thinking not shown folded: ${JSON.stringify(thinking)}`);
  const injected = await a.evaluate(() => ({
    prompts: document.querySelectorAll("#prompt").length,
    controls: document.querySelectorAll("#transcript textarea, #transcript dialog, #transcript [id], #transcript [onerror]").length,
    title: document.title,
  }));
  check(injected.prompts === 1 && injected.controls === 0 && injected.title !== "1", `agent HTML got into the page: ${JSON.stringify(injected)}`);
  ok("Esc cancels the running turn (run.end cancelled); the next prompt works, its thinking folded; agent HTML stays inert");

  // Fork, tree view, rename, delete — from the page.
  await a.click("#fork");
  await a.waitForFunction((id) => window.agentHost.current && window.agentHost.current !== id, session);
  const fork = await a.evaluate(() => window.agentHost.current);
  await a.waitForFunction(() => /fork of browser test/.test(document.getElementById("session-lineage").textContent));
  await a.click("#tree-toggle");
  const depth = await a.evaluate((id) => document.querySelector(`.session-row[data-session-id="${id}"]`).closest("li").style.getPropertyValue("--depth"), fork);
  check(depth === "1", `the fork is not under its parent in the tree view (depth ${depth})`);
  await a.click("#rename");
  await a.fill("#rename-title", "the fork");
  await a.press("#rename-title", "Enter");
  await a.waitForFunction((id) => document.querySelector(`.session-row[data-session-id="${id}"] .row-title`)?.textContent === "the fork", fork);
  await a.click("#delete");
  await a.click("#delete-confirm");
  await a.waitForFunction((id) => !document.querySelector(`.session-row[data-session-id="${id}"]`), fork);
  const gone = ahReply("session.get", { session_id: fork });
  check(gone.data && gone.data.error === "session_not_found", `the deleted fork: ${JSON.stringify(gone)}`);
  await a.click("#tree-toggle");
  await a.click(`.session-row[data-session-id="${session}"]`);
  await a.waitForFunction((id) => window.agentHost.current === id, session);
  ok("fork (shown under its parent), rename and delete work from the page");

  // ---- 4. reload mid-stream: every bracket once; kill -9 and restart the host --------
  await send(a, "SLOW again");
  await a.waitForFunction(() => (document.querySelector("#transcript .text.streaming .md")?.textContent.length || 0) > 5, null, { timeout: TURN });
  await tokensOf(a);
  await a.reload();
  await live(a);
  await a.waitForFunction((id) => window.agentHost.transcripts.get(id)?.loadedOnce, session);
  // A page that joins mid-block gets the block so far, then the rest: it shows it from its start.
  const rejoined = await a.evaluate(() => document.querySelector("#transcript .text.streaming .md")?.textContent ?? null);
  check(rejoined === null || rejoined.startsWith("slow 0 "), `after the reload the streaming block shows ${JSON.stringify(rejoined)}`);
  await waitRunEnds(a, "completed", 5);
  {
    await sameAsStore(a, session, "after the reload");
    const { events } = historySeqs(session);
    const kinds = (k) => events.filter((e) => e.kind === k).length;
    check((await a.locator("#transcript .user").count()) === kinds("user.text"), "user prompts shown twice or missing");
    check((await a.locator("#transcript .run-end").count()) === kinds("run.end"), "run ends shown twice or missing");
    check((await a.locator("#transcript .tool").count()) === kinds("tool.call.start"), "tool calls shown twice or missing");
  }
  ok(`a reload mid-stream resumes with every bracket once${rejoined === null ? "" : ", the open block shown from its start"}`);

  const pid = ahJson("host.status", {}).pid;
  process.kill(pid, "SIGKILL");
  await a.waitForSelector('#conn:not([data-state="live"])');
  const shown = await a.textContent("#conn");
  ah(["host.start"]);
  await a.waitForSelector('#conn[data-state="expired"]', { timeout: 30_000 });
  check(/agent-host open/.test(await a.textContent("#banner")), "the page does not say to run agent-host open");
  ok(`a killed host shows as "${shown}", and once back the page asks for agent-host open`);
  await visit(a, openUrl(session));
  await live(a);
  await a.waitForFunction((id) => window.agentHost.transcripts.get(id)?.loadedOnce, session);
  await sameAsStore(a, session, "after the restart");
  ok("after agent-host open again, the page shows the whole history");

  // ---- 5. another origin cannot connect; a foreign Host is refused ------------------
  const port = ahJson("host.status", {}).ws_port;
  const fresh = openUrl();
  const token = new URLSearchParams(new URL(fresh).hash.slice(1)).get("token");
  const foreign = http.createServer((req, res) => {
    res.writeHead(200, { "content-type": "text/html" });
    res.end(`<!doctype html><title>foreign</title><script>
      const ws = new WebSocket("ws://127.0.0.1:${port}/subscribe", ["agenthost.v1.json", "bearer.${token}"]);
      ws.onopen = () => { document.title = "opened"; };
      ws.onclose = () => { if (document.title !== "opened") document.title = "refused"; };
    </script>`);
  });
  await new Promise((r) => foreign.listen(0, "127.0.0.1", r));
  const evil = await contextB.newPage();
  await evil.goto(`http://127.0.0.1:${foreign.address().port}/`);
  await evil.waitForFunction(() => document.title === "refused" || document.title === "opened");
  check((await evil.title()) === "refused", "a page of another origin opened the WebSocket");
  foreign.close();
  // The same token works from the host's own origin, so the refusal was the origin's.
  const own = await contextB.newPage();
  await own.goto(fresh);
  await live(own);
  await tokensOf(own);
  // A dropped connection (the host still up): the page resumes from its cursor and has every
  // bracket committed meanwhile, once each. Its reconnect is held until a turn ran: until the
  // run's `run.end` reached another page (its list row is no sign: the row's preview is the
  // prompt's own text from its `user.text`, pushed while the session is still idle, before
  // the run starts).
  await own.evaluate(() => {
    const w = window.agentHost.wire;
    const on = w.onEvent;
    window.runsEnded = new Set();
    // When each bracket of a run came, in animation frames (what a waitForFunction polls on).
    window.frames = 0;
    const tick = () => {
      window.frames += 1;
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
    window.runFrames = {};
    w.onEvent = (push) => {
      if (push.event.k === "run.end") window.runsEnded.add(push.runId);
      if (!push.isDelta && push.runId) (window.runFrames[push.runId] ??= []).push(`${push.event.k}${push.event.state ? `:${push.event.state}` : ""}@${window.frames}`);
      on(push);
    };
  });
  await dropConnection(a);
  const away = ahJson("session.send", { session_id: session, text: "while the page was away" });
  await own.waitForFunction((run) => window.runsEnded.has(run), away.run_id, { timeout: TURN });
  await a.evaluate(() => window.reopen());
  await live(a);
  await sameAsStore(a, session, "after a dropped connection");
  check((await a.textContent("#transcript")).includes("echo: while the page was away"), "the turn run while the page was away is not shown");
  const frames = await own.evaluate((run) => window.runFrames[run], away.run_id);
  ok(`after a dropped connection the page resumes from its cursor: every bracket once, none missed (another page got the run as ${frames.join(" ")})`);

  // ---- 5b. the queue: prompts queued behind a turn (one waiting on a permission), edited,
  // moved and removed from the page; a steer; the session's rules; a reconnect mid-block ----
  const claudeAgent = (ahJson("agent.list", {}).agents || []).find((x) => x.agent_type === "claude");
  const steers = claudeAgent?.capabilities?.steer === true;
  const completedBefore = await runEnds(a, "completed");
  // The second page (its grant died with the killed host) on the session again.
  await visit(b, openUrl(session));
  await live(b);
  await b.waitForFunction((id) => window.agentHost.current === id && window.agentHost.transcripts.get(id)?.loadedOnce, session);
  await recordStreams(a);
  await recordStreams(b);
  await send(a, "TOOLCALL `touch queue-blocker && echo blocked`");
  await a.waitForSelector("#transcript .permission.pending", { timeout: TURN });
  await a.waitForSelector("#steer:not([hidden])");
  const queueUp = async (text, n) => {
    await send(a, text);
    await a.waitForFunction((k) => document.querySelectorAll("#queue .queue-item").length === k && document.getElementById("prompt").value === "", n);
  };
  await queueUp("SLOW after the queue", 1);
  await queueUp("queued one", 2);
  await queueUp("queued two", 3);
  const three = ["SLOW after the queue", "queued one", "queued two"];
  await waitPanel(a, three, "three prompts queued");
  await waitPanel(b, three, "three prompts queued, in the other page");
  check(JSON.stringify(ipcQueue(session)) === JSON.stringify(three), `session.get's queue: ${JSON.stringify(ipcQueue(session))}`);
  await a.screenshot({ path: path.join(SHOTS, "queue.png") });
  ok("prompts queued behind a running turn are listed in both pages, in order");

  await queued(a, "queued two").locator('[data-action="edit"]').click();
  await a.fill("#queue .queue-edit", "queued two, edited");
  await a.press("#queue .queue-edit", "Enter");
  await waitPanel(a, ["SLOW after the queue", "queued one", "queued two, edited"], "after the edit");
  check(ipcQueue(session)[2] === "queued two, edited", `session.get's queue after the edit: ${JSON.stringify(ipcQueue(session))}`);
  await queued(a, "queued two, edited").locator('[data-action="front"]').click();
  await waitPanel(a, ["queued two, edited", "SLOW after the queue", "queued one"], "after the move");
  await queued(a, "queued one").locator('[data-action="remove"]').click();
  const two = ["queued two, edited", "SLOW after the queue"];
  await waitPanel(a, two, "after the remove");
  await waitPanel(b, two, "after the remove, in the other page");
  check(JSON.stringify(ipcQueue(session)) === JSON.stringify(two), `session.get's queue after edit, move and remove: ${JSON.stringify(ipcQueue(session))}`);
  ok("an edit, a move to the front and a remove from the page take effect (session.get agrees), and show in the other page");

  await a.fill("#prompt", "steered in");
  await a.click("#steer");
  let ran;
  if (steers) {
    await a.waitForSelector("#transcript .user.steer", { timeout: TURN });
    ran = ["queued two, edited", "SLOW after the queue"];
    ok("a steer from the page reaches the running turn");
  } else {
    await a.waitForFunction(() => /steer_unsupported/.test(document.getElementById("composer-status").textContent));
    await a.waitForSelector('#transcript .notice.warning[data-code="steer_unsupported"]');
    ran = ["steered in", "queued two, edited", "SLOW after the queue"];
    await waitPanel(a, ran, "after a steer the agent cannot take");
    check(JSON.stringify(ipcQueue(session)) === JSON.stringify(ran), `session.get's queue after the steer: ${JSON.stringify(ipcQueue(session))}`);
    ok(`a steer claude cannot take goes to the head of the queue, and the page says so: "${await a.textContent("#composer-status")}"`);
  }

  // "Allow always": the rule is listed on the session, in both pages and over IPC.
  await a.focus("#transcript .permission.pending");
  await a.keyboard.press("a");
  await a.waitForSelector("#transcript .permission.resolved[data-kind=\"allow_always\"]");
  for (const p of [a, b]) await p.waitForSelector("#rules:not([hidden]) #rules-list li");
  const rules = ahJson("session.get", { session_id: session }).permission_rules;
  const listed = await a.textContent("#rules-list");
  check(rules.length >= 1 && listed.includes(rules[0].description), `the rules: ${JSON.stringify(rules)}; the page lists ${listed}`);
  ok(`an "allow always" answer is listed on the session: ${listed}`);

  // The queue runs in order; a reconnect in the middle of the slow block shows its text once.
  await a.waitForFunction(() => (document.querySelector("#transcript .text.streaming .md")?.textContent || "").startsWith("slow 0 ") && document.querySelectorAll("#queue .queue-item").length === 0, null, { timeout: TURN });
  await dropConnection(a);
  const grown = await b.evaluate(() => document.querySelector("#transcript .text.streaming .md")?.textContent.length || 0);
  await b.waitForFunction((n) => (document.querySelector("#transcript .text.streaming .md")?.textContent.length || 0) > n + 20, grown, { timeout: TURN });
  await a.evaluate(() => window.reopen());
  await live(a);
  check(await a.evaluate(() => !!document.querySelector("#transcript .text.streaming")), "the slow block ended before the page reconnected");
  await waitRunEnds(a, "completed", completedBefore + ran.length + 1);
  await sameAsStore(a, session, "after the queue ran");
  const { events: after } = historySeqs(session);
  const prompts = after.filter((e) => e.kind === "user.text").map((e) => e.event.text);
  check(JSON.stringify(prompts.slice(-ran.length)) === JSON.stringify(ran), `the prompts ran as ${JSON.stringify(prompts.slice(-ran.length - 1))}`);
  check(!prompts.includes("queued one") && !prompts.includes("queued two"), "a removed or edited-away prompt ran");
  const slowEnd = after.filter((e) => e.kind === "text.end" && e.event.text.startsWith("slow 0 ")).pop();
  const streamedA = await a.evaluate((end) => {
    const node = document.querySelector(`#transcript .text[data-end-seq="${end}"]`);
    return node ? window.streamedTexts.get(node.dataset.seq) ?? null : null;
  }, slowEnd.sequence_id);
  const streamedB = await b.evaluate((end) => {
    const node = document.querySelector(`#transcript .text[data-end-seq="${end}"]`);
    return node ? window.streamedTexts.get(node.dataset.seq) ?? null : null;
  }, slowEnd.sequence_id);
  check(streamedA === slowEnd.event.text, `reconnected mid-block, the page streamed ${JSON.stringify(streamedA)}; text.end is ${JSON.stringify(slowEnd.event.text)} (the page that stayed streamed ${JSON.stringify(streamedB)})`);
  await waitPanel(a, [], "once the queue ran");
  ok("the queue ran in order; reconnected mid-block, the page streamed the block once: what it showed is text.end");

  const status = await new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, path: "/", headers: { host: `evil.example:${port}` } }, (res) => {
      res.resume();
      resolve(res.statusCode);
    });
    req.on("error", reject);
    req.end();
  });
  check(status === 403, `a foreign Host got ${status}`);
  const csp = await new Promise((resolve, reject) => {
    http.get({ host: "127.0.0.1", port, path: "/" }, (res) => {
      res.resume();
      resolve(res.headers["content-security-policy"] || "");
    }).on("error", reject);
  });
  check(/script-src 'self'/.test(csp) && /connect-src 'self'/.test(csp) && !/unsafe-inline/.test(csp), `CSP: ${csp}`);
  ok("another origin cannot open the WebSocket; a foreign Host gets 403; the CSP is strict");

  // ---- 6. a session of 10,000 brackets: interactive fast, scrolls back through all ----
  // The baseline, in the same browser and run: the page opened on the small session.
  await visit(a, openUrl(session));
  await a.waitForSelector('body[data-ready="1"]');
  const smallReadyAt = await a.evaluate(() => window.agentHost.readyAt);
  const smallCount = (await pageSeqs(a, session)).length;
  const started = Date.now();
  await visit(a, openUrl(BIG));
  await a.waitForSelector('body[data-ready="1"]');
  const openMs = Date.now() - started;
  const readyAt = await a.evaluate(() => window.agentHost.readyAt);
  const firstPage = (await pageSeqs(a, BIG)).length;
  // The newest page only: the rest comes on scroll-back.
  check(firstPage > 0 && firstPage < BIG_COUNT, `the first view of the big session holds ${firstPage} of ${BIG_COUNT} brackets`);
  await a.screenshot({ path: path.join(SHOTS, "big-session.png") });
  const scrollStart = Date.now();
  let pages = 1;
  for (;;) {
    const done = await a.evaluate(() => !window.agentHost.transcripts.get(window.agentHost.current).hasOlder);
    if (done) break;
    const before = (await pageSeqs(a, BIG)).length;
    await a.evaluate(() => {
      document.getElementById("transcript").scrollTop = 0;
    });
    await a.waitForFunction((n) => window.agentHost.transcripts.get(window.agentHost.current).seqs().length > n || !window.agentHost.transcripts.get(window.agentHost.current).hasOlder, before);
    pages += 1;
    check(pages < 200, "scrolling back never reached the start");
  }
  check(pages > 1, "the big session came in one page, not the newest page first");
  const scrollMs = Date.now() - scrollStart;
  const all = await pageSeqs(a, BIG);
  const big = historySeqs(BIG);
  check(all.length === BIG_COUNT && JSON.stringify(all) === JSON.stringify(big.seqs), `scrolled back to ${all.length} of ${BIG_COUNT} brackets`);
  const firstText = big.events.find((e) => e.kind === "user.text").event.text;
  check((await a.locator("#transcript .user").first().textContent()).includes(firstText), "the oldest prompt is not at the top");
  await a.waitForSelector("#transcript .older .start", { state: "attached" });
  const diffs = await a.locator("#transcript .tool .diff .add").count();
  check(diffs > 0, "no Edit shown as a diff");
  const t0 = Date.now();
  await a.evaluate(() => {
    const el = document.getElementById("transcript");
    el.scrollTop = el.scrollHeight;
  });
  await a.waitForFunction(() => {
    const el = document.getElementById("transcript");
    return el.scrollHeight - el.scrollTop - el.clientHeight < 2;
  });
  figures.small_session_brackets = smallCount;
  figures.small_ready_after_navigation_ms = Math.round(smallReadyAt);
  figures.big_over_small_ready = Number((readyAt / smallReadyAt).toFixed(2));
  figures.big_session_brackets = BIG_COUNT;
  figures.big_open_ms = openMs;
  figures.big_ready_after_navigation_ms = Math.round(readyAt);
  figures.big_first_page_brackets = firstPage;
  figures.big_scrollback_ms = scrollMs;
  figures.big_scrollback_pages = pages;
  figures.big_scroll_to_end_ms = Date.now() - t0;
  figures.dom_nodes = await a.evaluate(() => document.getElementsByTagName("*").length);
  ok(`10,000 brackets: interactive ${Math.round(readyAt)} ms after navigation (${openMs} ms wall), scrolled back through ${pages} pages in ${scrollMs} ms`);

  await tokensOf(a);
  await tokensOf(b);
  check(consoleErrors.length === 0, `errors in the page's console: ${consoleErrors.join(" | ")}`);
  ok("no errors in the page's console");
} catch (e) {
  await failureReport();
  throw e;
} finally {
  writeFileSync(RESULTS, JSON.stringify({ tokens: [...tokens], figures }, null, 2));
  await browser.close();
}
