// The host's web UI: a client of the wire protocol (docs/protocol.md) and nothing else. It
// owns the page: the session list (paged, live), the open session (its transcript, prompt
// box, queue, permission prompts and actions) and the dialogs. The connection, the grant and
// the cursor are wire.js's; rendering events is transcript.js's.

import { Wire, storeToken, ReplyError } from "./wire.js";
import { Transcript, streamKey, promptFrom } from "./transcript.js";

const FIRST_PAGE = 200; // brackets of a session's newest page: what opening it waits for
const PAGE = 500; // brackets per older page, loaded as the user scrolls back
const LIST_PAGE = 50;
const LATEST = 9007199254740991; // before_seq of a session's newest page

// The page's own elements, looked up once before any agent output is on the page.
const elements = new Map([...document.querySelectorAll("[id]")].map((el) => [el.id, el]));
const $ = (id) => elements.get(id) || null;

const app = {
  wire: null,
  sessions: new Map(), // id → summary row (session.list's, kept current by events)
  order: [], // ids, newest activity first
  listCursor: null,
  tree: false,
  current: null,
  transcripts: new Map(),
  // session id → {items: [{run_id, text, truncated}], seq, version}: session.get's `queue`,
  // then every `queue.changed` (the whole queue after each change).
  queues: new Map(),
  rules: new Map(), // session id → session.get's permission_rules
  // session id → Map(block key → {run, text}): what this connection streamed of each open
  // block. The host sends a new connection each open block from its start ("Joining
  // mid-block", docs/protocol.md), so it is cleared at every hello and then appended to.
  streams: new Map(),
  editing: null, // {session, run_id, value}: the queued prompt being edited in place
  agents: [],
  opening: 0, // generation of the latest openSession
  draft: { text: null, id: null }, // the client_msg_id of the prompt box's text
  ready: false,
  readyAt: null,
};
window.agentHost = app; // for tests and the curious: state only, no secrets (the token is not here)

// ---- boot -------------------------------------------------------------------------------

function readFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const token = params.get("token");
  if (token) storeToken(token);
  const session = params.get("session");
  // The token leaves the address bar (and this entry of the history) at once.
  history.replaceState(null, "", location.pathname + (session ? `#session=${encodeURIComponent(session)}` : ""));
  return session;
}

window.addEventListener("hashchange", () => {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("token")) {
    readFragment();
    location.reload();
  } else if (params.get("session") && params.get("session") !== app.current) {
    openSession(params.get("session"));
  }
});

const wantedSession = readFragment();

app.wire = new Wire({
  onEvent,
  onState: connState,
  onHello: async ({ first }) => {
    // Before the replay and the deltas of this connection: the blocks still open come again
    // whole, from their start, so what the last connection streamed of them is dropped (the
    // page keeps showing it until the new one's first delta replaces it).
    app.streams.clear();
    if (!first) {
      // Resumed from the cursor: brackets missed meanwhile were replayed. Refresh what is
      // not an event (the list's order and previews, the queue).
      refreshList();
      if (app.current) refreshLive(app.current);
      return;
    }
    $("new-session").disabled = false;
    await loadSessions(true);
    const target = wantedSession || null;
    if (target) await openSession(target);
    loadAgents();
  },
});
app.wire.start();

// ---- connection indicator ---------------------------------------------------------------

function connState(state, detail) {
  const el = $("conn");
  el.dataset.state = state;
  const text = {
    connecting: "connecting…",
    live: "connected",
    reconnecting: "disconnected — reconnecting…",
    expired: "disconnected",
    closed: "closed",
  }[state] || state;
  el.textContent = text;
  el.title = detail || "";
  const banner = $("banner");
  if (state === "expired") {
    banner.hidden = false;
    banner.textContent = "The host restarted (or this page's link expired): its grant is no longer valid. Run `agent-host open` for a new link.";
  } else if (state === "reconnecting") {
    banner.hidden = false;
    banner.textContent = `Lost the connection to the host (${detail || "closed"}). Reconnecting; nothing is lost meanwhile.`;
  } else {
    banner.hidden = true;
  }
  document.body.dataset.conn = state;
  for (const id of ["send", "steer", "cancel", "fork", "rename", "delete", "new-session", "queue-clear"]) {
    const b = $(id);
    if (state !== "live") b.dataset.offline = "1";
    else delete b.dataset.offline;
  }
}

function status(text) {
  $("composer-status").textContent = text || "";
}

function errorText(e) {
  if (e instanceof ReplyError) return `${e.message} (${e.name_ || e.code})`;
  return String(e && e.message ? e.message : e);
}

// ---- session list -----------------------------------------------------------------------

async function loadSessions(reset) {
  const params = { limit: LIST_PAGE };
  if (!reset && app.listCursor) params.cursor = app.listCursor;
  let page;
  try {
    page = await app.wire.ok("session.list", params);
  } catch (e) {
    status(`Could not list sessions: ${errorText(e)}`);
    return;
  }
  if (reset) {
    app.order = [];
  }
  for (const row of page.sessions) {
    const known = app.sessions.get(row.session_id);
    app.sessions.set(row.session_id, { ...known, ...row });
    if (!app.order.includes(row.session_id)) app.order.push(row.session_id);
  }
  app.listCursor = page.next_cursor;
  $("more-sessions").hidden = !page.next_cursor;
  renderList();
}

let refreshTimer = null;
function refreshList() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(async () => {
    // The first page again: new sessions, order, previews; rows further down stay as known.
    try {
      const page = await app.wire.ok("session.list", { limit: LIST_PAGE });
      const firstIds = page.sessions.map((r) => r.session_id);
      for (const row of page.sessions) app.sessions.set(row.session_id, { ...app.sessions.get(row.session_id), ...row });
      app.order = [...firstIds, ...app.order.filter((id) => !firstIds.includes(id) && app.sessions.has(id))];
      if (app.listCursor === null && page.next_cursor) app.listCursor = page.next_cursor;
      renderList();
    } catch {
      // Disconnected: the next hello refreshes.
    }
  }, 150);
}

function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return new Date(ms).toLocaleDateString();
}

function titleOf(row) {
  return row.title || `untitled ${row.agent_type} session`;
}

function stateLabel(state) {
  return state === "waiting" ? "needs you" : state;
}

function sessionItem(row, depth) {
  const li = document.createElement("li");
  li.className = "session-item";
  li.style.setProperty("--depth", depth);
  const b = document.createElement("button");
  b.type = "button";
  b.className = "session-row";
  b.dataset.sessionId = row.session_id;
  b.dataset.state = row.state;
  if (row.session_id === app.current) b.setAttribute("aria-current", "true");
  const title = document.createElement("span");
  title.className = "row-title";
  title.textContent = titleOf(row);
  const badge = document.createElement("span");
  badge.className = `badge state-${row.state}`;
  badge.textContent = stateLabel(row.state);
  const meta = document.createElement("span");
  meta.className = "row-meta";
  meta.textContent = `${row.agent_type} · ${row.cwd} · ${ago(row.last_activity_ms || row.updated_at_ms)}`;
  const preview = document.createElement("span");
  preview.className = "row-preview";
  preview.textContent = row.preview || "";
  b.append(title, " ", badge, meta, preview);
  if (row.parent_session_id) {
    const parent = app.sessions.get(row.parent_session_id);
    const lineage = document.createElement("span");
    lineage.className = "row-lineage";
    lineage.textContent = `fork of ${parent ? titleOf(parent) : row.parent_session_id.slice(0, 8)}`;
    b.append(lineage);
  }
  b.setAttribute("aria-label", `${titleOf(row)}, ${row.agent_type}, ${stateLabel(row.state)}`);
  b.addEventListener("click", () => openSession(row.session_id));
  li.append(b);
  return li;
}

function renderList() {
  const ul = $("session-list");
  const focused = document.activeElement && document.activeElement.classList.contains("session-row") ? document.activeElement.dataset.sessionId : null;
  const rows = app.order.map((id) => app.sessions.get(id)).filter(Boolean);
  const items = [];
  if (app.tree) {
    const children = new Map();
    const ids = new Set(rows.map((r) => r.session_id));
    for (const r of rows) {
      const p = r.parent_session_id && ids.has(r.parent_session_id) ? r.parent_session_id : null;
      if (!children.has(p)) children.set(p, []);
      children.get(p).push(r);
    }
    const walk = (parent, depth) => {
      for (const r of children.get(parent) || []) {
        items.push(sessionItem(r, depth));
        walk(r.session_id, depth + 1);
      }
    };
    walk(null, 0);
  } else {
    for (const r of rows) items.push(sessionItem(r, 0));
  }
  ul.replaceChildren(...items);
  if (focused) ul.querySelector(`.session-row[data-session-id="${CSS.escape(focused)}"]`)?.focus();
  const waiting = rows.filter((r) => r.state === "waiting").length;
  document.title = waiting ? `(${waiting}) agent-host — needs you` : "agent-host";
  if (app.current) renderHeader();
}

$("more-sessions").addEventListener("click", () => loadSessions(false));
$("tree-toggle").addEventListener("click", () => {
  app.tree = !app.tree;
  $("tree-toggle").setAttribute("aria-pressed", String(app.tree));
  renderList();
});
$("session-list").addEventListener("keydown", (ev) => {
  if (ev.key !== "ArrowDown" && ev.key !== "ArrowUp") return;
  const buttons = [...document.querySelectorAll(".session-row")];
  const i = buttons.indexOf(document.activeElement);
  if (i < 0) return;
  ev.preventDefault();
  const next = buttons[Math.max(0, Math.min(buttons.length - 1, i + (ev.key === "ArrowDown" ? 1 : -1)))];
  next.focus();
});

/** An event updates the list row of its session (state, activity, preview). */
function listUpdate(push) {
  const row = app.sessions.get(push.sessionId);
  if (!row) {
    refreshList(); // a session this page has not listed yet
    return;
  }
  const e = push.event;
  row.last_activity_ms = Date.now();
  if (e.k === "session.state") row.state = e.state;
  if ((e.k === "user.text" || e.k === "text.end") && e.text) row.preview = e.text.slice(0, 160);
  const i = app.order.indexOf(push.sessionId);
  if (i > 0) {
    app.order.splice(i, 1);
    app.order.unshift(push.sessionId);
  }
  scheduleRender();
}

let renderPending = false;
function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(() => {
    renderPending = false;
    renderList();
  });
}

// ---- events -----------------------------------------------------------------------------

function onEvent(push) {
  const t = app.transcripts.get(push.sessionId);
  if (push.isDelta) {
    const full = streamDelta(push);
    if (t && t.loadedOnce) {
      const stick = nearBottom();
      t.delta(push, full);
      if (stick && push.sessionId === app.current) scrollToBottom();
    }
    return;
  }
  if (t) {
    const stick = nearBottom();
    t.add([push], true);
    if (stick && push.sessionId === app.current) scrollToBottom();
  }
  forgetStreams(push);
  const e = push.event;
  if (e.k === "queue.changed") applyQueueEvent(push);
  if (push.sessionId === app.current) {
    if (e.k === "warning" && e.code === "steer_unsupported") status(`Not steered: ${e.message} (steer_unsupported)`);
    // An "allow always" answer: the session's rules changed.
    if (e.k === "permission.resolved" && e.rule) refreshLive(push.sessionId);
  }
  listUpdate(push);
  if (push.sessionId === app.current && (e.k === "session.state" || e.k === "run.end")) renderHeader();
}

// ---- streamed blocks --------------------------------------------------------------------

/** A delta appended to its block's text on this connection: the block's text so far, or null
 * for a delta that streams no text the page shows. */
function streamDelta(push) {
  const key = streamKey(push);
  if (!key) return null;
  let blocks = app.streams.get(push.sessionId);
  if (!blocks) app.streams.set(push.sessionId, (blocks = new Map()));
  const entry = blocks.get(key) || { run: push.runId, text: "" };
  entry.text += push.event.text ?? push.event.output ?? "";
  blocks.set(key, entry);
  return entry.text;
}

/** What a session's block streamed so far on this connection (undefined: nothing). */
function streamed(sessionId, key) {
  return app.streams.get(sessionId)?.get(key)?.text;
}

/** A block's end (its run's end, the session going idle) forgets what it streamed. */
function forgetStreams(push) {
  const blocks = app.streams.get(push.sessionId);
  if (!blocks) return;
  const e = push.event;
  if (e.k === "text.end" || e.k === "thinking.end") blocks.delete(`${e.k.split(".")[0]}:${push.runId}:${e.itemId || ""}`);
  else if (e.k === "tool.exec.end") blocks.delete(`tool:${e.callId}`);
  else if (e.k === "run.end") {
    for (const [key, entry] of blocks) if (entry.run === push.runId) blocks.delete(key);
  } else if (e.k === "session.state" && e.state === "idle") app.streams.delete(push.sessionId);
}

// ---- the queue --------------------------------------------------------------------------

function queueOf(id) {
  let q = app.queues.get(id);
  if (!q) app.queues.set(id, (q = { items: [], seq: 0, version: 0, loaded: false }));
  return q;
}

/** A `queue.changed` bracket: the whole queue after the change. */
function applyQueueEvent(push) {
  const q = queueOf(push.sessionId);
  if (push.seq && push.seq <= q.seq) return;
  q.seq = push.seq;
  q.version += 1;
  q.loaded = true;
  const items = Array.isArray(push.event.queue) ? push.event.queue : [];
  q.items = items.map((x) => ({ run_id: x.runId, text: x.text ?? "", truncated: !!x.truncated, from: x.from }));
  // Texts cut to fit the bracket: session.get has them whole.
  if (q.items.some((x) => x.truncated)) refreshLive(push.sessionId);
  if (push.sessionId === app.current) renderQueue();
}

// ---- the open session -------------------------------------------------------------------

function nearBottom() {
  const el = $("transcript");
  return el.scrollHeight - el.scrollTop - el.clientHeight < 80;
}

function scrollToBottom() {
  const el = $("transcript");
  el.scrollTop = el.scrollHeight;
}

function hooks() {
  return {
    own: () => app.wire.subscriberId,
    openSession: (id) => openSession(id),
    streamed,
    respond: async (sessionId, requestId, optionId) => {
      try {
        await app.wire.ok("permission.respond", { session_id: sessionId, request_id: requestId, option_id: optionId });
        return null;
      } catch (e) {
        return `Not answered: ${errorText(e)}`;
      }
    },
    changed: (node) => {
      // A new permission request: focus it unless the user is typing.
      const active = document.activeElement;
      const typing = active && (active.tagName === "TEXTAREA" || active.tagName === "INPUT") && active.value;
      if (node && !typing && !document.querySelector("dialog[open]")) node.focus({ preventScroll: false });
    },
  };
}

async function openSession(id) {
  const generation = ++app.opening;
  const stale = () => generation !== app.opening;
  app.current = id;
  history.replaceState(null, "", `${location.pathname}#session=${encodeURIComponent(id)}`);
  $("empty").hidden = true;
  $("session").hidden = false;
  let row = app.sessions.get(id);
  if (!row) {
    try {
      row = await app.wire.ok("session.get", { session_id: id });
      app.sessions.set(id, { ...row, last_activity_ms: row.updated_at_ms });
      if (!app.order.includes(id)) app.order.push(id);
    } catch (e) {
      if (!stale()) status(`Could not open the session: ${errorText(e)}`);
      return;
    }
    if (stale()) return;
  }
  let t = app.transcripts.get(id);
  const box = $("transcript");
  if (!t) {
    t = new Transcript(id, hooks());
    app.transcripts.set(id, t);
    const older = document.createElement("button");
    older.type = "button";
    older.className = "older-button";
    older.textContent = "Load older messages";
    older.addEventListener("click", () => loadOlder(t));
    t.top.append(older);
    t.olderButton = older;
  }
  box.replaceChildren(t.el);
  renderList();
  renderHeader();
  renderQueue();
  renderRules();
  if (!t.loadedOnce) {
    // The first page, once, however often the session is opened meanwhile.
    t.firstPage ??= loadOlder(t).then(() => {
      t.loadedOnce = true;
      t.syncStreams(); // deltas that came while the first page loaded
      observeTop(t);
    });
    await t.firstPage;
    if (stale()) return;
  }
  scrollToBottom();
  refreshLive(id);
  if (!app.ready) {
    app.ready = true;
    app.readyAt = performance.now();
    document.body.dataset.ready = "1";
  }
  // A pending permission request is what the user is here for; else the prompt box.
  const pending = t.pendingPermissions();
  if (pending.length) pending[pending.length - 1].focus();
  else $("prompt").focus();
}

/** The page of brackets before the oldest loaded one (the newest page first). */
async function loadOlder(t) {
  if (!t.hasOlder || t.loading) return;
  t.loading = true;
  const box = $("transcript");
  const fromBottom = box.scrollHeight - box.scrollTop;
  try {
    const page = await app.wire.ok("session.history", {
      session_id: t.sessionId,
      before_seq: t.oldest === null ? LATEST : t.oldest,
      limit: t.oldest === null ? FIRST_PAGE : PAGE,
    });
    const entries = page.events.map((e) => ({ seq: e.sequence_id, runId: e.run_id || "", event: e.event }));
    t.add(entries);
    t.oldest = page.next_before_seq ?? (entries.length ? entries[0].seq : t.oldest);
    t.hasOlder = !!page.has_more;
    if (t.sessionId === app.current && t.loadedOnce) box.scrollTop = box.scrollHeight - fromBottom;
  } catch (e) {
    status(`Could not load the history: ${errorText(e)}`);
  } finally {
    t.loading = false;
  }
  t.olderButton.hidden = !t.hasOlder;
  // Still in view after the page came (a short page, a tall window): the next one too.
  if (t.hasOlder && t.loadedOnce && t.sessionId === app.current) {
    const top = t.top.getBoundingClientRect().bottom;
    if (top > box.getBoundingClientRect().top - 600) setTimeout(() => loadOlder(t), 0);
  }
  t.top.dataset.start = t.hasOlder ? "" : "1";
  if (!t.hasOlder && !t.top.querySelector(".start")) {
    const p = document.createElement("p");
    p.className = "start";
    p.textContent = "The start of this session.";
    t.top.append(p);
  }
}

function observeTop(t) {
  const io = (t.observer = new IntersectionObserver(
    (entries) => {
      if (entries.some((e) => e.isIntersecting) && t.sessionId === app.current && t.hasOlder) loadOlder(t);
    },
    { root: $("transcript"), rootMargin: "600px 0px 0px 0px" },
  ));
  io.observe(t.top);
}

async function refreshLive(id) {
  const before = queueOf(id).version;
  try {
    const detail = await app.wire.ok("session.get", { session_id: id });
    const row = app.sessions.get(id);
    if (row) Object.assign(row, { state: detail.state, title: detail.title });
    // A queue.changed that came meanwhile is at least as new as this reply.
    const q = queueOf(id);
    if (q.version === before) {
      q.items = (detail.queue || []).map((x) => ({ run_id: x.run_id, text: x.text ?? "", truncated: false, from: x.from }));
      q.loaded = true;
    }
    app.rules.set(id, detail.permission_rules || []);
    if (id === app.current) {
      renderQueue();
      renderRules();
      renderHeader();
    }
  } catch {
    // The session went away, or the connection: shown elsewhere.
  }
}

function renderHeader() {
  const row = app.sessions.get(app.current);
  if (!row) return;
  $("session-title").textContent = titleOf(row);
  $("session-agent").textContent = row.agent_type;
  $("session-cwd").textContent = row.cwd;
  const st = $("session-state");
  st.textContent = stateLabel(row.state);
  st.dataset.state = row.state;
  const lineage = $("session-lineage");
  lineage.replaceChildren();
  if (row.parent_session_id) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "link";
    const parent = app.sessions.get(row.parent_session_id);
    b.textContent = `fork of ${parent ? titleOf(parent) : row.parent_session_id.slice(0, 8)}`;
    b.addEventListener("click", () => openSession(row.parent_session_id));
    lineage.append(b);
  }
  const busy = row.state === "running" || row.state === "waiting";
  $("cancel").disabled = !busy;
  // While a turn runs, Send queues the prompt; Steer gives it to the running turn.
  $("steer").hidden = !busy;
  $("send").textContent = busy ? "Queue" : "Send";
  $("send").title = busy ? "Runs after the current turn (Enter)" : "Send (Enter)";
}

function button(text, attrs, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  for (const [k, v] of Object.entries(attrs)) b.setAttribute(k, v);
  b.addEventListener("click", onClick);
  return b;
}

async function queueCommand(command, params, failed) {
  try {
    return await app.wire.ok(command, { session_id: app.current, ...params });
  } catch (e) {
    status(e instanceof ReplyError && e.name_ === "not_queued" ? `${failed}: it already started or left the queue.` : `${failed}: ${errorText(e)}`);
    return null;
  }
}

async function saveEdit() {
  const ed = app.editing;
  if (!ed) return;
  const r = await queueCommand("queue.edit", { run_id: ed.run_id, text: ed.value }, "Not edited");
  if (app.editing === ed) app.editing = null;
  if (r) status("");
  renderQueue();
}

function queueItem(item, i, count) {
  const li = document.createElement("li");
  li.className = "queue-item";
  li.dataset.runId = item.run_id;
  const label = item.text || item.run_id;
  const ed = app.editing;
  if (ed && ed.session === app.current && ed.run_id === item.run_id) {
    const area = document.createElement("textarea");
    area.className = "queue-edit";
    area.rows = 2;
    area.value = ed.value;
    area.setAttribute("aria-label", "Edit the queued prompt (Enter saves, Esc cancels)");
    area.addEventListener("input", () => (ed.value = area.value));
    area.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        saveEdit();
      } else if (ev.key === "Escape") {
        // Not the page's Esc (cancel the running turn): only the edit.
        ev.preventDefault();
        ev.stopPropagation();
        app.editing = null;
        renderQueue();
      }
    });
    const actions = document.createElement("span");
    actions.className = "queue-actions";
    actions.append(
      button("Save", { "data-action": "save" }, saveEdit),
      button("Cancel", { "data-action": "cancel-edit" }, () => {
        app.editing = null;
        renderQueue();
      }),
    );
    li.append(area, actions);
    return li;
  }
  const text = document.createElement("span");
  text.className = "queue-text";
  text.textContent = item.text + (item.truncated ? "…" : "");
  const actions = document.createElement("span");
  actions.className = "queue-actions";
  actions.append(
    button("Edit", { "data-action": "edit", "aria-label": `Edit queued prompt: ${label}` }, () => {
      app.editing = { session: app.current, run_id: item.run_id, value: item.text, focus: true };
      renderQueue();
    }),
  );
  const up = button("Up", { "data-action": "up", "aria-label": `Move up: ${label}` }, () => queueCommand("queue.move", { run_id: item.run_id, position: i - 1 }, "Not moved"));
  const front = button("To front", { "data-action": "front", "aria-label": `Run next: ${label}` }, () => queueCommand("queue.move", { run_id: item.run_id, position: 0 }, "Not moved"));
  up.disabled = front.disabled = i === 0;
  actions.append(up, front, button("Remove", { "data-action": "remove", "aria-label": `Remove queued prompt: ${label}` }, () => queueCommand("queue.remove", { run_id: item.run_id }, "Not removed")));
  const pos = document.createElement("span");
  pos.className = "queue-pos";
  pos.textContent = `${i + 1}.`;
  pos.title = i === 0 ? "runs next" : `runs after ${i} other${i > 1 ? "s" : ""}`;
  li.setAttribute("aria-label", `Queued ${i + 1} of ${count}: ${label}`);
  li.append(pos, " ", text, " ");
  const from = promptFrom(item.from, app.wire.subscriberId);
  if (from) {
    const who = document.createElement("span");
    who.className = "queue-from";
    who.textContent = from;
    li.append(who, " ");
  }
  li.append(actions);
  return li;
}

function renderQueue() {
  const ol = $("queue");
  const items = app.current ? queueOf(app.current).items : [];
  const ed = app.editing;
  const active = document.activeElement;
  const hadFocus = ed && active && active.classList.contains("queue-edit");
  const caret = hadFocus ? [active.selectionStart, active.selectionEnd] : null;
  if (ed && ed.session === app.current && !items.some((x) => x.run_id === ed.run_id)) {
    app.editing = null;
    status("The prompt being edited started (or left the queue) before the edit was saved.");
  }
  ol.replaceChildren(...items.map((item, i) => queueItem(item, i, items.length)));
  $("queue-count").textContent = items.length ? `(${items.length})` : "";
  $("queue-panel").hidden = items.length === 0;
  const area = ol.querySelector(".queue-edit");
  if (area && (hadFocus || (app.editing && app.editing.focus))) {
    app.editing.focus = false;
    area.focus();
    if (caret) area.setSelectionRange(caret[0], caret[1]);
  }
}

$("queue-clear").addEventListener("click", async () => {
  const r = await queueCommand("queue.clear", {}, "Not cleared");
  if (r) status(`Took ${r.removed.length} prompt${r.removed.length === 1 ? "" : "s"} out of the queue.`);
});

function renderRules() {
  const rules = (app.current && app.rules.get(app.current)) || [];
  const own = app.wire.subscriberId;
  $("rules-list").replaceChildren(
    ...rules.map((r) => {
      const li = document.createElement("li");
      li.dataset.requestId = r.request_id;
      const what = document.createElement("span");
      what.className = "rule-text";
      what.textContent = r.description || `${r.tool}: ${r.label}`;
      const who = document.createElement("span");
      who.className = "rule-meta";
      const by = r.by === own ? "here" : r.by === "ipc" ? "from the terminal" : r.by === "relay" ? "from the relay" : "from another client";
      who.textContent = ` — ${r.label || r.option_id}, chosen ${by}, ${ago(r.at_ms)}`;
      li.append(what, who);
      return li;
    }),
  );
  $("rules").hidden = rules.length === 0;
}

// ---- prompt, cancel, fork, rename, delete, new ------------------------------------------

/** The prompt box's text as a prompt (`session.send`) or, while a turn runs, as more input
 * for it (`session.steer`). */
async function send(mode = "send") {
  const box = $("prompt");
  const text = box.value;
  if (!text.trim() || !app.current) return;
  const session = app.current;
  status(mode === "steer" ? "Steering…" : "Sending…");
  try {
    // One idempotency key per text: a retry after a lost reply is the same prompt, not two.
    if (app.draft.text !== text || app.draft.session !== session || app.draft.mode !== mode || !app.draft.id)
      app.draft = { text, session, mode, id: crypto.randomUUID() };
    const params = { session_id: session, text, client_msg_id: app.draft.id };
    const r = await app.wire.ok(mode === "steer" ? "session.steer" : "session.send", params);
    box.value = "";
    app.draft = { text: null, id: null };
    if (mode === "steer" && r.steered) status("Steered: the running turn has it.");
    else if (mode === "steer" && r.queued) {
      // The warning's own message may have come first.
      if (!/steer_unsupported/.test($("composer-status").textContent)) status("Not steered: the agent cannot take input mid-turn; the prompt runs next (steer_unsupported).");
    } else if (r.queued) status("Queued: it runs after the current turn.");
    else status(r.duplicate ? "Already sent (the first reply was lost): not sent twice." : "");
  } catch (e) {
    status(`Not sent: ${errorText(e)}`);
  }
}

function busy() {
  const row = app.sessions.get(app.current);
  return !!row && (row.state === "running" || row.state === "waiting");
}

$("prompt-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  send();
});
$("steer").addEventListener("click", () => send("steer"));
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    // Ctrl+Enter steers the running turn.
    send((ev.ctrlKey || ev.metaKey) && busy() ? "steer" : "send");
  }
});

async function cancel() {
  if (!app.current) return;
  try {
    const r = await app.wire.ok("session.cancel", { session_id: app.current });
    status(r.state === "cancelling" ? "Cancelling the running turn…" : "Cancelled.");
  } catch (e) {
    status(`Nothing cancelled: ${errorText(e)}`);
  }
}
$("cancel").addEventListener("click", cancel);

document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && !document.querySelector("dialog[open]") && app.current) {
    const row = app.sessions.get(app.current);
    if (row && (row.state === "running" || row.state === "waiting")) {
      ev.preventDefault();
      cancel();
    }
  }
});

$("fork").addEventListener("click", async () => {
  if (!app.current) return;
  try {
    const r = await app.wire.ok("session.fork", { session_id: app.current });
    app.sessions.set(r.session_id, { ...r.session, last_activity_ms: Date.now(), preview: null });
    app.order.unshift(r.session_id);
    await openSession(r.session_id);
  } catch (e) {
    status(`Not forked: ${errorText(e)}`);
  }
});

function dialog(id, onSubmit) {
  const d = $(id);
  const form = d.querySelector("form");
  form.addEventListener("submit", async (ev) => {
    const value = ev.submitter ? ev.submitter.value : "";
    if (value === "cancel") return; // method=dialog closes it
    ev.preventDefault();
    const err = await onSubmit();
    const shown = d.querySelector(".form-error");
    if (err) shown.textContent = err;
    else {
      shown.textContent = "";
      d.close();
    }
  });
  return d;
}

const renameDialog = dialog("rename-dialog", async () => {
  const title = $("rename-title").value.trim();
  if (!title) return "A title is needed.";
  try {
    const r = await app.wire.ok("session.rename", { session_id: app.current, title });
    Object.assign(app.sessions.get(app.current), { title: r.session.title });
    renderList();
    return null;
  } catch (e) {
    return errorText(e);
  }
});
$("rename").addEventListener("click", () => {
  const row = app.sessions.get(app.current);
  $("rename-title").value = row ? row.title || "" : "";
  renameDialog.showModal();
});

const deleteDialog = dialog("delete-dialog", async () => {
  const id = app.current;
  try {
    await app.wire.ok("session.delete", { session_id: id });
  } catch (e) {
    return errorText(e);
  }
  app.sessions.delete(id);
  app.order = app.order.filter((x) => x !== id);
  app.transcripts.get(id)?.observer?.disconnect();
  app.transcripts.delete(id);
  app.queues.delete(id);
  app.rules.delete(id);
  app.streams.delete(id);
  app.current = null;
  history.replaceState(null, "", location.pathname);
  $("session").hidden = true;
  $("empty").hidden = false;
  renderList();
  return null;
});
$("delete").addEventListener("click", () => {
  const row = app.sessions.get(app.current);
  $("delete-text").textContent = `“${row ? titleOf(row) : app.current}” and every stored event of it will be deleted. The agent's own session files stay.`;
  deleteDialog.showModal();
});

async function loadAgents() {
  try {
    const data = await app.wire.ok("agent.list", {});
    app.agents = data.agents || [];
  } catch {
    app.agents = [];
  }
  const select = $("new-agent");
  select.replaceChildren(
    ...app.agents.map((a) => {
      const o = document.createElement("option");
      o.value = a.agent_type;
      o.textContent = a.usable ? `${a.agent_type}${a.version ? ` (${a.version})` : ""}` : `${a.agent_type} — not usable: ${a.reason || a.error}`;
      o.disabled = !a.usable || a.turns === false;
      return o;
    }),
  );
  const first = app.agents.find((a) => a.usable && a.turns !== false);
  if (first) select.value = first.agent_type;
}

const newDialog = dialog("new-dialog", async () => {
  const agent_type = $("new-agent").value;
  const cwd = $("new-cwd").value.trim();
  const title = $("new-title").value.trim();
  if (!agent_type || !cwd) return "An agent and a working directory are needed.";
  const params = { agent_type, cwd };
  if (title) params.title = title;
  try {
    const r = await app.wire.ok("session.create", params);
    localStorage.setItem("agent-host.cwd", cwd);
    app.sessions.set(r.session_id, { ...r.session, last_activity_ms: Date.now(), preview: null });
    app.order.unshift(r.session_id);
    $("new-title").value = "";
    openSession(r.session_id);
    return null;
  } catch (e) {
    return errorText(e);
  }
});
$("new-session").addEventListener("click", async () => {
  if (!app.agents.length) await loadAgents();
  const row = app.sessions.get(app.current);
  $("new-cwd").value = localStorage.getItem("agent-host.cwd") || (row ? row.cwd : "");
  $("new-error").textContent = "";
  newDialog.showModal();
});

// Relative times stay current.
setInterval(() => scheduleRender(), 30_000);
