// The page's one connection to the host: the WebSocket at /subscribe in the JSON codec
// (`agenthost.v1.json`), as docs/protocol.md describes it. It owns the grant token (kept in
// this tab's sessionStorage and renewed over the wire), the cursor (the newest bracket seen,
// so a reconnect resumes with no gap and no duplicate), requests and their replies, and the
// connection state shown by the indicator.

const SUBPROTOCOL = "agenthost.v1.json";
const TOKEN_KEY = "agent-host.token";
const RENEW_EVERY_MS = 30_000;
const REQUEST_TIMEOUT_MS = 30_000;
const ACK_EVERY_MS = 2_000;
// The host answers HTTP but refuses the upgrade this many times in a row: the grant is void.
const REFUSALS_BEFORE_EXPIRED = 3;

/** The grant token of this tab, if any. */
export function storedToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function storeToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

/** A reply with a non-zero code, as an Error carrying it. */
export class ReplyError extends Error {
  constructor(reply) {
    super(reply.message);
    this.code = reply.code;
    this.name_ = reply.data && reply.data.error;
    this.data = reply.data;
  }
}

/**
 * States: "connecting", "live", "reconnecting" (the host went away; retrying), "expired" (the
 * host is up but refuses this tab's grant: it restarted, or the link ran out), "closed".
 */
export class Wire {
  constructor({ onEvent, onState, onHello }) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.onHello = onHello;
    this.cursor = null; // newest bracket sequence_id handled (a string of digits)
    this.acked = null;
    this.subscriberId = null;
    this.hostVersion = null;
    this.nextRequest = 1;
    this.pending = new Map();
    this.ws = null;
    this.state = "connecting";
    this.backoff = 250;
    this.timers = [];
    this.everOpened = false;
    this.refusals = 0; // upgrades refused in a row while the host answered HTTP
  }

  setState(state, detail) {
    this.state = state;
    this.onState(state, detail);
  }

  start() {
    this.open();
    this.timers.push(setInterval(() => this.renew(), RENEW_EVERY_MS));
    this.timers.push(setInterval(() => this.ack(), ACK_EVERY_MS));
    // A hidden tab's timers are throttled: renew as soon as it is seen again, and reconnect
    // at once when the network comes back.
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.renew();
    });
    window.addEventListener("online", () => {
      if (this.state === "reconnecting") {
        this.backoff = 250;
        if (!this.ws) this.open();
      }
    });
  }

  open() {
    const token = storedToken();
    if (!token) {
      this.setState("expired", "no grant");
      return;
    }
    const url = `ws://${location.host}/subscribe`;
    let opened = false;
    let ws;
    try {
      ws = new WebSocket(url, [SUBPROTOCOL, `bearer.${token}`]);
    } catch (e) {
      this.setState("reconnecting", String(e));
      this.retry();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      opened = true;
      const hello = { clientName: "agent-host web", protocolVersion: 1 };
      if (this.cursor !== null) hello.cursor = this.cursor;
      this.send({ cmd: "HELLO", requestId: "0", body: hello });
    };
    ws.onmessage = (m) => this.receive(m.data);
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      for (const [, p] of this.pending) p.reject(new Error("the connection closed"));
      this.pending.clear();
      if (this.state === "closed") return;
      if (opened) {
        this.setState("reconnecting", ev.reason || `closed (${ev.code})`);
        this.retry();
      } else {
        // Refused before any frame: a 401/403 and a host that is down look alike here, so
        // ask the server whether it is up at all.
        this.probe();
      }
    };
  }

  async probe() {
    let up = false;
    try {
      const r = await fetch("/", { method: "HEAD", cache: "no-store" });
      up = r.ok;
    } catch {
      up = false;
    }
    if (up && ++this.refusals >= REFUSALS_BEFORE_EXPIRED) {
      this.setState("expired", "the host refused this page's grant");
    } else if (up) {
      // Maybe a passing failure (a handshake timed out under load): try again first.
      this.setState("reconnecting", "the host refused the connection; retrying");
      this.retry();
    } else {
      this.refusals = 0;
      this.setState("reconnecting", "the host does not answer");
      this.retry();
    }
  }

  retry() {
    const wait = this.backoff;
    this.backoff = Math.min(this.backoff * 2, 4000);
    setTimeout(() => {
      if (this.state !== "closed" && this.state !== "expired") this.open();
    }, wait);
  }

  send(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(frame));
      return true;
    }
    return false;
  }

  receive(text) {
    let frame;
    try {
      frame = JSON.parse(text);
    } catch {
      return;
    }
    const body = frame.body || {};
    switch (frame.cmd) {
      case "HELLO_RESP": {
        this.subscriberId = body.subscriberId;
        this.hostVersion = body.hostVersion;
        // Replay starts after `replayFrom`: what came before is already in history pages.
        if (this.cursor === null && body.replayFrom !== undefined) this.cursor = String(body.replayFrom);
        if (this.cursor === null) this.cursor = "0";
        this.backoff = 250;
        this.refusals = 0;
        const first = !this.everOpened;
        this.everOpened = true;
        this.setState("live");
        this.onHello({ first, subscriberId: this.subscriberId, hostVersion: this.hostVersion });
        this.renew();
        break;
      }
      case "EVENT_PUSH": {
        let event;
        try {
          event = JSON.parse(body.eventJson);
        } catch {
          return;
        }
        const seq = body.sequenceId || "0";
        const push = {
          seq: Number(seq),
          sessionId: body.sessionId || event.sessionId,
          runId: body.runId || event.runId || "",
          isDelta: !!body.isDelta,
          event,
        };
        if (!push.isDelta && BigInt(seq) > BigInt(this.cursor || "0")) this.cursor = seq;
        this.onEvent(push);
        break;
      }
      case "REPLY": {
        const p = this.pending.get(frame.requestId);
        if (!p) return;
        this.pending.delete(frame.requestId);
        let data = null;
        try {
          data = body.dataJson ? JSON.parse(body.dataJson) : null;
        } catch {
          data = null;
        }
        p.resolve({ code: body.code || 0, message: body.message || "", data });
        break;
      }
      case "ERROR_RESP": {
        const p = this.pending.get(frame.requestId);
        if (p) {
          this.pending.delete(frame.requestId);
          p.resolve({ code: body.code || 1, message: body.message || body.name, data: { error: body.name } });
        }
        break;
      }
      default:
        break;
    }
  }

  /** One command of the command envelope; resolves with {code, message, data}. */
  request(command, params = {}) {
    const requestId = String(this.nextRequest++);
    return new Promise((resolve, reject) => {
      const frame = {
        cmd: "REQUEST",
        requestId,
        body: { command, paramsJson: JSON.stringify(params) },
      };
      if (!this.send(frame)) {
        reject(new Error("not connected"));
        return;
      }
      const timer = setTimeout(() => {
        if (this.pending.delete(requestId)) reject(new Error(`${command}: no reply`));
      }, REQUEST_TIMEOUT_MS);
      this.pending.set(requestId, {
        resolve: (r) => {
          clearTimeout(timer);
          resolve(r);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
    });
  }

  /** A command that must succeed: its data, or a ReplyError. */
  async ok(command, params = {}) {
    const reply = await this.request(command, params);
    if (reply.code !== 0) throw new ReplyError(reply);
    return reply.data;
  }

  /** A fresh grant for this tab, so a reload keeps working while the host runs. */
  async renew() {
    if (this.state !== "live" || !this.subscriberId) return;
    try {
      const data = await this.ok("subscriber.grant", { subscriber_id: this.subscriberId });
      if (data && data.ws_token) storeToken(data.ws_token);
    } catch {
      // Not connected any more: the next connection renews.
    }
  }

  ack() {
    if (this.cursor !== null && this.cursor !== this.acked) {
      if (this.send({ cmd: "ACK", requestId: "0", body: { cursor: this.cursor } })) this.acked = this.cursor;
    }
  }
}
