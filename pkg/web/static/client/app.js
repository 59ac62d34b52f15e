// src/protocol.ts
var MAX_FRAME_BYTES = 16 * 1024 * 1024;
var MAX_TEXT_CHARS = 12e3;
var MAX_AUDIO_BYTES = 8 * 1024 * 1024;
var MAX_MEDIA_BYTES = 8 * 1024 * 1024;
var MEDIA_CHUNK_BYTES = 3 * 1024 * 1024;
var MIN_MEDIA_CHUNK_BYTES = 4096;
var MAX_MEDIA_PARTS = 2048;
var MAX_ID_CHARS = 128;
var MAX_PUSH_TOKEN_BYTES = 4096;
var HermesError = class extends Error {
  constructor(code, message, opts = {}) {
    super(`${code}: ${message}`);
    this.name = "HermesError";
    this.code = code;
    this.fatal = !!opts.fatal;
    this.local = !!opts.local;
    if (opts.id) this.id = opts.id;
  }
  /** Errors after which the client does not reconnect: retrying as is cannot help. */
  get permanent() {
    return this.code === "auth_failed" || this.code === "forbidden";
  }
};
function charCount(s) {
  let n = 0;
  for (const _ of s) n++;
  return n;
}
var B64 = typeof globalThis.Buffer === "function" ? globalThis.Buffer : null;
function toBase64(b) {
  if (B64) return B64.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");
  let s = "";
  for (let i = 0; i < b.length; i += 32768) s += String.fromCharCode.apply(null, b.subarray(i, i + 32768));
  return btoa(s);
}
function fromBase64(s) {
  if (B64) {
    const buf = B64.from(s, "base64");
    return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  }
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
function newId(prefix = "") {
  const b = new Uint8Array(12);
  globalThis.crypto.getRandomValues(b);
  return prefix + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// src/backoff.ts
var MAX_RETRY_AFTER = 5 * 60 * 1e3;
function backoffWindow(attempt, base, cap) {
  if (!(base > 0) || !(cap > 0)) return 0;
  const n = Math.max(0, Math.floor(attempt));
  return Math.min(cap, base * 2 ** Math.min(n, 1023));
}
function fullJitter(attempt, base, cap, random = Math.random) {
  return unit(random) * backoffWindow(attempt, base, cap);
}
function retryDelay(o, random = Math.random) {
  const max = o.max ?? MAX_RETRY_AFTER;
  const floor = o.floor !== void 0 && o.floor > 0 ? o.floor : 0;
  return Math.min(max, floor + fullJitter(o.attempt, o.base, o.cap, random));
}
var MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
var IMF_FIXDATE = /^[a-z]{3}, (\d{2}) ([a-z]{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) gmt$/i;
var RFC850 = /^[a-z]{6,9}, (\d{2})-([a-z]{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) gmt$/i;
var ASCTIME = /^[a-z]{3} ([a-z]{3}) ([ \d]\d) (\d{2}):(\d{2}):(\d{2}) (\d{4})$/i;
function utc(year, mon, day, h, m, s) {
  const month = MONTHS.indexOf(mon.toLowerCase());
  if (month < 0 || day < 1 || day > 31 || h > 23 || m > 59 || s > 60) return void 0;
  const t = Date.UTC(year, month, day, h, m, s);
  return Number.isFinite(t) ? t : void 0;
}
function parseHTTPDate(value, now = Date.now()) {
  const v = value.trim();
  let m = IMF_FIXDATE.exec(v);
  if (m) return utc(+m[3], m[2], +m[1], +m[4], +m[5], +m[6]);
  if (m = RFC850.exec(v)) {
    let year = 2e3 + +m[3];
    if (year > new Date(now).getUTCFullYear() + 50) year -= 100;
    return utc(year, m[2], +m[1], +m[4], +m[5], +m[6]);
  }
  if (m = ASCTIME.exec(v)) return utc(+m[6], m[1], +m[2].trim(), +m[3], +m[4], +m[5]);
  return void 0;
}
function parseRetryAfter(value, now = Date.now()) {
  if (Array.isArray(value)) value = value[0];
  if (typeof value !== "string") return void 0;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1e3;
  const t = parseHTTPDate(v, now);
  return t === void 0 ? void 0 : Math.max(0, t - now);
}
function unit(random) {
  const r = random();
  return Number.isFinite(r) ? Math.min(Math.max(r, 0), 1) : 0;
}

// src/client.ts
var consoleLogger = (level, message, data) => {
  if (level === "error") console.error("hermes:", message, data ?? "");
};
var defaultSleep = (ms, signal) => new Promise((resolve) => {
  if (signal.aborted) return resolve();
  const t = setTimeout(done, ms);
  function done() {
    clearTimeout(t);
    signal.removeEventListener("abort", done);
    resolve();
  }
  signal.addEventListener("abort", done, { once: true });
});
var ALL_EVENTS = [
  "ready",
  "state",
  "disconnected",
  "retry",
  "message",
  "media",
  "mediaProgress",
  "prompt",
  "promptDone",
  "avatar",
  "typing",
  "delivered",
  "push",
  "error",
  "frame",
  "sent",
  "acknowledged"
];
function bytesOf(b) {
  return b instanceof Uint8Array ? b : new Uint8Array(b);
}
function local(code, message) {
  return new HermesError(code, message, { local: true });
}
var Client = class {
  // push frames written and not answered, in order
  constructor(opts) {
    /** The last ready frame; null before the first. */
    this.readyFrame = null;
    this.state = "closed";
    this.avatar = "idle";
    this.typing = false;
    this.ws = null;
    this.handlers = /* @__PURE__ */ new Map();
    this.outbox = /* @__PURE__ */ new Map();
    this.seq = 0;
    this.pings = /* @__PURE__ */ new Map();
    this.lastTs = 0;
    this.transientError = false;
    this.messages = /* @__PURE__ */ new Map();
    this.incoming = /* @__PURE__ */ new Map();
    this.attempt = 0;
    this.stopped = true;
    this.retryWait = null;
    // the pause before the next attempt
    this.opened = false;
    // the current socket opened
    this.seesStatus = false;
    // the current socket shows the HTTP answer of a refused upgrade
    this.refusal = null;
    // the current attempt's refused upgrade
    this.readyAt = 0;
    this.keepalive = null;
    this.typingTimer = null;
    this.firstReady = null;
    this.openTimer = null;
    this.failure = "";
    // why the current socket is failing, for connect()'s error
    this.gotReady = false;
    // on the current socket
    this.offline = [];
    // card answers and deliveries written after the next ready
    this.resendTimer = null;
    this.closers = /* @__PURE__ */ new Set();
    // ends the events() iterators
    this.writes = 0;
    // frames written on this socket
    this.unconfirmed = [];
    // ids written since the last pong, for errors
    this.pushes = [];
    this.opts = {
      reconnect: true,
      minDelay: 500,
      maxDelay: 3e4,
      pingInterval: 25e3,
      pongTimeout: 15e3,
      autoAck: true,
      typingIdle: 6e3,
      connectTimeout: 1e4,
      readyTimeout: 1e4,
      maxResends: 8,
      maxRetryAfter: MAX_RETRY_AFTER,
      assumedRetryAfter: 1e3,
      stableAfter: 1e4,
      random: Math.random,
      sleep: defaultSleep,
      now: () => Date.now(),
      logger: consoleLogger,
      ...opts,
      device: { ...opts.device, id: opts.device?.id || "dev-" + newId().slice(0, 12) }
    };
  }
  on(type, fn) {
    let set = this.handlers.get(type);
    if (!set) this.handlers.set(type, set = /* @__PURE__ */ new Set());
    set.add(fn);
    return () => set.delete(fn);
  }
  /** Like on(), for the first event only. */
  once(type, fn) {
    const off = this.on(type, (v) => {
      off();
      fn(v);
    });
    return off;
  }
  /** Removes a handler given to on(). */
  off(type, fn) {
    this.handlers.get(type)?.delete(fn);
  }
  /**
   * The events of the given types (all when none) as an async iterator, in
   * order, from now until close() or until signal aborts:
   * `for await (const ev of c.events(["message"])) ...`. Events wait in the
   * iterator until read.
   */
  events(types, opts = {}) {
    const queue = [];
    let wake = null;
    let done = false;
    const offs = [];
    const finish = () => {
      done = true;
      offs.forEach((off) => off());
      wake?.();
    };
    for (const type of types ?? ALL_EVENTS) {
      offs.push(
        this.on(type, (value) => {
          queue.push({ type, value });
          wake?.();
        })
      );
    }
    this.closers.add(finish);
    offs.push(() => this.closers.delete(finish));
    if (opts.signal?.aborted) finish();
    opts.signal?.addEventListener("abort", finish, { once: true });
    const it = {
      [Symbol.asyncIterator]: () => it,
      next: async () => {
        while (!queue.length && !done) await new Promise((r) => wake = r);
        wake = null;
        if (queue.length) return { value: queue.shift(), done: false };
        return { value: void 0, done: true };
      },
      return: async () => {
        finish();
        queue.length = 0;
        return { value: void 0, done: true };
      }
    };
    return it;
  }
  emit(type, v) {
    for (const fn of this.handlers.get(type) ?? []) {
      try {
        fn(v);
      } catch (e) {
        this.opts.logger("error", `a ${type} handler threw`, e);
      }
    }
  }
  /** The capabilities of the last ready frame. */
  get capabilities() {
    return this.readyFrame?.capabilities ?? null;
  }
  /** Ids of texts and files not yet confirmed taken. */
  get pending() {
    return [...this.outbox.keys()];
  }
  /**
   * Connects and resolves with the first ready frame; rejects on an error
   * that stops the client (auth_failed, forbidden), when the first
   * connection fails (connect_failed), or when close() is called first. An
   * upgrade the edge refuses with 503 or 429 (it sheds load) is not a
   * failure: the client waits as it would to reconnect (Retry-After plus
   * jitter) and tries again, and connect() resolves at the later ready.
   */
  connect(opts = {}) {
    if (!this.stopped) return Promise.reject(local("bad_frame", "already connected"));
    const signal = opts.signal;
    if (signal?.aborted) return Promise.reject(local("cancelled", "connect() cancelled"));
    this.stopped = false;
    this.attempt = 0;
    const p = new Promise((resolve, reject) => this.firstReady = { resolve, reject });
    if (signal) {
      const abort = () => {
        if (!this.firstReady) return;
        this.failFirst(local("cancelled", "connect() cancelled"));
        this.close();
      };
      signal.addEventListener("abort", abort, { once: true });
      p.then(
        () => signal.removeEventListener("abort", abort),
        () => signal.removeEventListener("abort", abort)
      );
    }
    this.opts.logger("info", `connecting to ${this.opts.url}`);
    this.open();
    return p;
  }
  /** Closes the connection and stops reconnecting. Unconfirmed sends stay pending for the next connect(). */
  close() {
    this.stopped = true;
    for (const end of [...this.closers]) end();
    this.cancelRetry();
    clearTimeout(this.resendTimer);
    this.failFirst(local("internal_error", "closed"));
    if (this.ws) {
      const ws = this.ws;
      this.detach();
      try {
        ws.close(1e3);
      } catch {
      }
      this.emit("disconnected", { code: 1e3, reason: "closed by the app", reconnect: false });
    }
    this.setState("closed");
  }
  /** Drops the socket as a lost network would; the client reconnects (for tests and "retry now" buttons). */
  drop() {
    if (!this.ws) return;
    const ws = this.ws;
    try {
      if (typeof ws.terminate === "function") ws.terminate();
      else ws.close(4e3, "dropped");
    } catch {
    }
    this.onClose(1006, "");
  }
  giveUp(why) {
    this.failure = why;
    this.drop();
  }
  open() {
    const WS = this.opts.WebSocket ?? globalThis.WebSocket;
    if (!WS) throw local("internal_error", "no WebSocket: pass the ws package's WebSocket in options.WebSocket");
    this.setState("connecting");
    let ws;
    this.failure = "";
    this.gotReady = false;
    this.opened = false;
    this.seesStatus = false;
    this.refusal = null;
    try {
      ws = new WS(this.opts.url);
    } catch (e) {
      this.failure = `cannot open ${this.opts.url}: ${e?.message ?? e}`;
      this.onClose(1006, "");
      return;
    }
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    this.seesStatus = typeof ws.on === "function";
    if (this.seesStatus) {
      ws.on("unexpected-response", (_req, res) => {
        if (this.ws === ws) {
          const retryAfter = parseRetryAfter(res.headers?.["retry-after"], this.opts.now());
          this.refusal = { status: res.statusCode, retryAfter };
          this.failure = `upgrade refused with HTTP ${res.statusCode}` + (retryAfter !== void 0 ? `, Retry-After ${retryAfter / 1e3} s` : "");
        }
        res.resume?.();
        ws.terminate();
      });
    }
    this.openTimer = setTimeout(() => this.giveUp(`no connection within ${this.opts.connectTimeout} ms`), this.opts.connectTimeout);
    ws.onopen = async () => {
      this.opened = true;
      clearTimeout(this.openTimer);
      this.openTimer = setTimeout(() => this.giveUp(`no ready within ${this.opts.readyTimeout} ms`), this.opts.readyTimeout);
      let token = this.opts.token;
      if (this.opts.getToken) {
        try {
          token = await this.opts.getToken();
        } catch (e) {
          if (this.ws === ws) this.giveUp(`getToken failed: ${e?.message ?? e}`);
          return;
        }
        if (this.ws !== ws) return;
      }
      const hello = { t: "hello", token, device: this.opts.device };
      if (this.opts.user) hello.user = this.opts.user;
      this.write(hello);
    };
    ws.onmessage = (ev) => {
      let text2 = ev.data;
      if (typeof text2 !== "string") text2 = new TextDecoder().decode(bytesOf(text2));
      let f;
      try {
        f = JSON.parse(text2);
      } catch {
        return;
      }
      if (f && typeof f === "object" && typeof f.t === "string") this.handle(f);
    };
    ws.onclose = (ev) => {
      if (this.ws === ws) this.onClose(ev?.code ?? 1006, ev?.reason ?? "");
    };
    ws.onerror = (ev) => {
      if (!this.failure) this.failure = ev?.message || ev?.error?.message || `cannot connect to ${this.opts.url}`;
    };
  }
  detach() {
    if (!this.ws) return;
    this.ws.onopen = this.ws.onmessage = this.ws.onclose = null;
    this.ws.onerror = () => {
    };
    this.ws = null;
    clearInterval(this.keepalive);
    clearTimeout(this.openTimer);
    clearTimeout(this.resendTimer);
    for (const p of this.pings.values()) {
      clearTimeout(p.timer);
      p.reject(local("internal_error", "connection closed before pong"));
    }
    this.pings.clear();
    for (const p of this.pushes.splice(0)) {
      clearTimeout(p.timer);
      p.reject(local("internal_error", "connection closed before the push frame was answered; register again after the next ready"));
    }
    this.unconfirmed = [];
    this.writes = 0;
    for (const o of this.outbox.values()) o.seq = 0;
    this.incoming.clear();
  }
  onClose(code, reason) {
    this.detach();
    if (this.gotReady && this.opts.now() - this.readyAt >= this.opts.stableAfter) this.attempt = 0;
    if (code === 1008 && (reason === "auth_failed" || reason === "forbidden")) {
      this.stop(new HermesError(reason, "connection refused", { fatal: true }));
    } else if (!this.gotReady && this.firstReady && !this.shed()) {
      const why = this.failure || (code === 1006 ? `cannot connect to ${this.opts.url}` : `closed with ${code} ${reason}`.trim());
      const err = local("connect_failed", why);
      this.emit("error", err);
      this.stop(err);
    } else if (code === 1e3) {
      this.stop(local("internal_error", "replaced by a newer connection"));
    }
    const reconnect = !this.stopped && this.opts.reconnect;
    this.opts.logger(reconnect ? "warn" : "info", `socket closed (${code}${reason ? " " + reason : ""}${this.failure ? ": " + this.failure : ""})`, { reconnect });
    if (this.gotReady || this.stopped) this.emit("disconnected", { code, reason: reason || this.failure, reconnect });
    if (this.stopped) {
      this.setState("closed");
      return;
    }
    this.scheduleRetry();
  }
  stop(err) {
    this.stopped = true;
    for (const end of [...this.closers]) end();
    this.cancelRetry();
    this.failFirst(err);
    this.setState("closed");
  }
  failFirst(err) {
    if (this.firstReady) {
      this.firstReady.reject(err);
      this.firstReady = null;
    }
  }
  /** The edge shed this attempt (503 or 429 before the upgrade): it is there, and says come back later. */
  shed() {
    return this.opts.reconnect && this.refusal !== null && (this.refusal.status === 503 || this.refusal.status === 429);
  }
  scheduleRetry() {
    this.setState(this.opts.reconnect ? "connecting" : "closed");
    if (!this.opts.reconnect) {
      this.stop(local("internal_error", "connection lost"));
      return;
    }
    const retry = { attempt: this.attempt, delay: 0, reason: this.failure || "connection lost" };
    let floor;
    if (this.refusal) {
      retry.status = this.refusal.status;
      if (this.shed() && this.refusal.retryAfter !== void 0) floor = retry.retryAfter = this.refusal.retryAfter;
    } else if (!this.opened && !this.seesStatus) {
      floor = retry.retryAfter = this.opts.assumedRetryAfter;
    }
    retry.delay = retryDelay(
      { attempt: this.attempt++, base: this.opts.minDelay, cap: this.opts.maxDelay, floor, max: this.opts.maxRetryAfter },
      this.opts.random
    );
    this.cancelRetry();
    const wait = this.retryWait = new AbortController();
    this.opts.logger("debug", `reconnecting in ${Math.round(retry.delay)} ms`, retry);
    this.emit("retry", retry);
    if (this.stopped || wait.signal.aborted) return;
    this.opts.sleep(retry.delay, wait.signal).then(
      () => {
        if (this.retryWait !== wait || wait.signal.aborted || this.stopped) return;
        this.retryWait = null;
        this.open();
      },
      (e) => this.opts.logger("error", "sleep failed", e)
    );
  }
  cancelRetry() {
    this.retryWait?.abort();
    this.retryWait = null;
  }
  setState(s) {
    if (this.state === s) return;
    this.state = s;
    this.emit("state", s);
  }
  write(f) {
    if (!this.ws || this.ws.readyState !== 1) return false;
    this.ws.send(JSON.stringify(f));
    this.writes++;
    const id = f.t === "prompt" ? f.prompt_id : f.t === "text" || f.t === "audio" || f.t === "deliver" || f.t === "media" && !f.part ? f.id : "";
    if (id) this.unconfirmed.push({ id, n: this.writes });
    this.emit("sent", f);
    return true;
  }
  handle(f) {
    this.emit("frame", f);
    switch (f.t) {
      case "ready":
        clearTimeout(this.openTimer);
        this.gotReady = true;
        this.readyAt = this.opts.now();
        this.readyFrame = f;
        this.setState("open");
        this.emit("ready", f);
        if (this.firstReady) {
          this.firstReady.resolve(f);
          this.firstReady = null;
        }
        this.flush();
        for (const q of this.offline.splice(0)) this.write(q);
        if (this.opts.pingInterval > 0) {
          this.keepalive = setInterval(() => this.ping().catch(() => {
          }), this.opts.pingInterval);
        }
        break;
      case "message":
        this.onMessage(f);
        break;
      case "media":
        this.onMedia(f);
        break;
      case "prompt":
        this.emit("prompt", f);
        break;
      case "prompt_done":
        this.emit("promptDone", f);
        break;
      case "avatar":
        this.avatar = ["idle", "thinking", "speaking"].includes(f.state) ? f.state : "idle";
        this.emit("avatar", this.avatar);
        break;
      case "typing":
        this.setTyping(!f.stop);
        break;
      case "pong":
        this.onPong(f.ts);
        break;
      case "delivered":
        this.emit("delivered", { id: f.id, device: f.device });
        break;
      case "push": {
        const i = this.pushes.findIndex((p) => p.kind === f.kind);
        if (i >= 0) {
          const [p] = this.pushes.splice(i, 1);
          clearTimeout(p.timer);
          p.resolve();
        }
        this.emit("push", { kind: f.kind, registered: !!f.registered });
        break;
      }
      case "error":
        this.onError(f);
        break;
      default:
    }
  }
  onError(f) {
    if (this.pushes.length > 0 && !f.fatal && (f.message ?? "").startsWith("push")) {
      const p = this.pushes.shift();
      clearTimeout(p.timer);
      const err2 = new HermesError(f.code, f.message ?? "");
      p.reject(err2);
      this.emit("error", err2);
      return;
    }
    const ids = new Set(this.unconfirmed.map((u) => u.id));
    const err = new HermesError(f.code, f.message ?? "", { fatal: !!f.fatal, id: ids.size === 1 ? [...ids][0] : void 0 });
    if (f.code === "internal_error") this.transientError = true;
    if (err.permanent && err.fatal) this.stop(err);
    this.emit("error", err);
  }
  setTyping(on) {
    clearTimeout(this.typingTimer);
    if (on) this.typingTimer = setTimeout(() => this.setTyping(false), this.opts.typingIdle);
    if (this.typing !== on) {
      this.typing = on;
      this.emit("typing", on);
    }
  }
  onMessage(f) {
    const index = f.chunk?.index ?? 0;
    const text2 = index === 0 ? f.text ?? "" : (this.messages.get(f.id) ?? "") + (f.text ?? "");
    if (f.final) this.messages.delete(f.id);
    else this.messages.set(f.id, text2);
    this.emit("message", { id: f.id, text: text2, final: !!f.final, edit: !!f.edit });
    if (f.final) {
      this.setTyping(false);
      this.ack(f.id);
    }
  }
  onMedia(f) {
    const parts = Math.max(1, f.parts | 0);
    const part = f.part | 0;
    if (parts > MAX_MEDIA_PARTS || part < 0 || part >= parts || (f.size | 0) > MAX_MEDIA_BYTES) {
      this.incoming.delete(f.id);
      this.emit("error", local("too_big", `incoming file ${f.id}: part ${part} of ${parts}, ${f.size} bytes is past the limits`));
      return;
    }
    let inc = this.incoming.get(f.id);
    if (!inc || part === 0) {
      inc = { meta: f, parts: new Array(parts), got: 0 };
      this.incoming.set(f.id, inc);
    }
    if (f.data != null && !inc.parts[part]) {
      inc.parts[part] = fromBase64(f.data);
      inc.got++;
    }
    this.emit("mediaProgress", { id: f.id, part, parts });
    if (!f.final && inc.got < parts) return;
    this.incoming.delete(f.id);
    if (inc.got < parts && inc.got > 0) {
      this.emit("error", new HermesError("bad_frame", `incoming file ${f.id}: ${inc.got} of ${parts} parts`, { local: true, id: f.id }));
      return;
    }
    const m = inc.meta;
    const file = { id: f.id, kind: m.kind, mime: m.mime, filename: m.filename, size: m.size };
    if (m.caption) file.caption = m.caption;
    if (m.reply_to) file.reply_to = m.reply_to;
    if (f.url || m.url) file.url = f.url || m.url;
    if (inc.got > 0) {
      const total = inc.parts.reduce((n, p) => n + (p?.length ?? 0), 0);
      const data = new Uint8Array(total);
      let off = 0;
      for (const p of inc.parts) {
        if (p) {
          data.set(p, off);
          off += p.length;
        }
      }
      file.data = data;
    }
    this.emit("media", file);
    this.ack(f.id);
  }
  /** Sends ack{id}; done for you unless autoAck is false. */
  ack(id, force = false) {
    if (this.opts.autoAck || force) this.write({ t: "ack", id });
  }
  // Sending.
  checkId(id) {
    const v = id || newId("c-");
    if (v.length > MAX_ID_CHARS) throw local("bad_frame", `id longer than ${MAX_ID_CHARS} characters`);
    return v;
  }
  enqueue(id, frames) {
    this.outbox.set(id, { id, frames, seq: 0, sends: 0 });
    if (this.state === "open") this.flush();
    return id;
  }
  /** Writes what is pending and not yet written on this socket, then a ping to learn it was taken. */
  flush() {
    let wrote = false;
    for (const o of this.outbox.values()) {
      if (o.seq !== 0) continue;
      for (const f of o.frames) if (!this.write(f)) return;
      o.seq = ++this.seq;
      wrote = true;
    }
    if (wrote) this.ping().catch(() => {
    });
  }
  onPong(ts) {
    const p = typeof ts === "number" ? this.pings.get(ts) : void 0;
    if (!p) return;
    this.pings.delete(ts);
    clearTimeout(p.timer);
    this.unconfirmed = this.unconfirmed.filter((u) => u.n > p.writes);
    const retry = this.transientError;
    this.transientError = false;
    let sends = 0;
    for (const [id, o] of this.outbox) {
      if (o.seq === 0 || o.seq > p.mark) continue;
      if (!retry) {
        this.outbox.delete(id);
        this.emit("acknowledged", id);
      } else if (++o.sends > this.opts.maxResends) {
        this.outbox.delete(id);
        this.emit("error", new HermesError("internal_error", `${id}: given up after ${o.sends} sends met internal_error`, { id }));
      } else {
        o.seq = 0;
        sends = Math.max(sends, o.sends);
      }
    }
    if (sends > 0) {
      clearTimeout(this.resendTimer);
      const cap = Math.min(this.opts.maxDelay, this.opts.minDelay * 2 ** (sends - 1));
      this.resendTimer = setTimeout(() => this.state === "open" && this.flush(), cap / 2 + this.opts.random() * cap / 2);
    }
    p.resolve(Date.now() - p.sentAt);
  }
  /** Sends a text; returns its id. */
  sendText(text2, id) {
    if (typeof text2 !== "string" || text2.trim() === "") throw local("bad_frame", "empty text");
    const n = charCount(text2);
    const max = this.capabilities?.max_text_chars ?? MAX_TEXT_CHARS;
    if (n > max) throw local("too_big", `text of ${n} characters; at most ${max}`);
    const mid = this.checkId(id);
    return this.enqueue(mid, [{ t: "text", id: mid, text: text2 }]);
  }
  /** Sends a voice recording (wav or ogg, ≤ 8 MiB); text is its transcript when you have one. */
  sendVoice(data, format, opts = {}) {
    const b = bytesOf(data);
    if (format !== "wav" && format !== "ogg") throw local("unsupported_frame", `audio format ${format}: wav or ogg`);
    if (b.length === 0) throw local("bad_frame", "empty recording");
    if (b.length > MAX_AUDIO_BYTES) throw local("too_big", `recording of ${b.length} bytes; at most ${MAX_AUDIO_BYTES}`);
    if (opts.text && charCount(opts.text) > MAX_TEXT_CHARS) throw local("too_big", `text over ${MAX_TEXT_CHARS} characters`);
    const id = this.checkId(opts.id);
    const f = { t: "audio", id, format, data: toBase64(b) };
    if (opts.text) f.text = opts.text;
    return this.enqueue(id, [f]);
  }
  /** Sends a file, in parts of chunkBytes (3 MiB) when it is larger; returns its id. */
  sendFile(data, opts) {
    const frames = mediaFrames(bytesOf(data), { ...opts, id: this.checkId(opts.id) }, this.capabilities?.max_media_bytes);
    return this.enqueue(frames[0].id, frames);
  }
  /** Answers a card: an option id, or a text (clarify's "other"). */
  answer(promptId, optionId, text2) {
    if (!promptId) throw local("bad_frame", "prompt_id is required");
    if (!optionId && !text2) throw local("bad_frame", "an option_id or a text is required");
    const f = { t: "prompt", prompt_id: promptId };
    if (optionId) f.option_id = optionId;
    if (text2) f.text = text2;
    this.writeOrQueue(f);
  }
  /** Writes f now, or after the next ready when not connected (card answers and deliveries). */
  writeOrQueue(f) {
    if (this.state !== "open" || !this.write(f)) this.offline.push(f);
  }
  /** Tells the agent the user is typing. */
  sendTyping() {
    this.write({ t: "typing" });
  }
  /** Service delivery (cron, hermes send): only from loopback or with a deliver token. */
  deliver(opts) {
    if (!opts.text && !opts.media) throw local("bad_frame", "deliver needs a text or a media");
    const id = this.checkId(opts.id);
    const f = { t: "deliver", id };
    if (opts.target) f.target = opts.target;
    if (opts.text) f.text = opts.text;
    if (opts.media) f.media = opts.media;
    this.writeOrQueue(f);
    return id;
  }
  /**
   * Registers the app's push token for this device, so that the gateway
   * wakes the app while it holds no socket: kind "fcm" with the
   * registration token Firebase Cloud Messaging gave the app, "apns" with
   * the APNs device token in hex. The gateway's extension of Protocol v1
   * (docs/protocol-notes.md). Resolves once the gateway stored it; call it
   * after every connect() and whenever the platform hands out a new token
   * (a registration lasts 30 days). Rejects, without sending, with
   * unsupported_frame when the gateway does not offer kind (ready's
   * capabilities.push: an older gateway offers none) and internal_error
   * when not connected; else with the gateway's error: bad_frame (a token
   * that cannot be one), internal_error (send it again).
   */
  registerPush(kind, token) {
    if (this.state !== "open") return Promise.reject(local("internal_error", "not connected: register the push token after ready"));
    const offered = this.capabilities?.push ?? [];
    if (!offered.includes(kind)) {
      return Promise.reject(local("unsupported_frame", `the gateway sends no ${kind} notifications (capabilities.push: ${offered.join(", ") || "none"})`));
    }
    if (token.length > MAX_PUSH_TOKEN_BYTES || /[^\x21-\x7e]/.test(token)) {
      return Promise.reject(local("bad_frame", `a push token is printable ASCII without spaces, at most ${MAX_PUSH_TOKEN_BYTES} bytes`));
    }
    return new Promise((resolve, reject) => {
      const p = { kind, resolve, reject, timer: null };
      if (!this.write({ t: "push", kind, token })) {
        reject(local("internal_error", "not connected"));
        return;
      }
      p.timer = setTimeout(() => {
        const i = this.pushes.indexOf(p);
        if (i >= 0) this.pushes.splice(i, 1);
        reject(local("internal_error", "the push frame was not answered in time; register again"));
      }, this.opts.pongTimeout);
      this.pushes.push(p);
    });
  }
  /** Takes back the app's push token of kind: the gateway stops waking this device through that service. */
  removePush(kind) {
    return this.registerPush(kind, "");
  }
  /** Round-trip time in ms of a ping; rejects when the connection closes or no pong comes in time. */
  ping() {
    return new Promise((resolve, reject) => {
      const ts = this.lastTs = Math.max(this.lastTs + 1, Date.now());
      const p = { sentAt: Date.now(), mark: this.seq, writes: this.writes, resolve, reject, timer: null };
      if (!this.write({ t: "ping", ts })) {
        reject(local("internal_error", "not connected"));
        return;
      }
      p.timer = setTimeout(() => {
        this.pings.delete(ts);
        reject(local("internal_error", "no pong in time"));
        this.drop();
      }, this.opts.pongTimeout);
      this.pings.set(ts, p);
    });
  }
};
function mediaFrames(data, opts, maxBytes = MAX_MEDIA_BYTES) {
  if (!["image", "video", "document", "audio"].includes(opts.kind)) throw local("unsupported_frame", `media kind ${opts.kind}`);
  if (data.length === 0) throw local("bad_frame", "empty file");
  if (data.length > maxBytes) throw local("too_big", `file of ${data.length} bytes; at most ${maxBytes}`);
  if (opts.caption && charCount(opts.caption) > MAX_TEXT_CHARS) throw local("too_big", `caption over ${MAX_TEXT_CHARS} characters`);
  const chunk = opts.chunkBytes ?? MEDIA_CHUNK_BYTES;
  if (!(chunk >= MIN_MEDIA_CHUNK_BYTES && chunk <= MEDIA_CHUNK_BYTES)) {
    throw local("bad_frame", `chunkBytes ${chunk}: between ${MIN_MEDIA_CHUNK_BYTES} and ${MEDIA_CHUNK_BYTES}`);
  }
  const parts = Math.ceil(data.length / chunk);
  if (parts > MAX_MEDIA_PARTS) throw local("too_big", `${parts} parts; at most ${MAX_MEDIA_PARTS}`);
  const frames = [];
  for (let i = 0; i < parts; i++) {
    const f = { t: "media", id: opts.id, kind: opts.kind, data: toBase64(data.subarray(i * chunk, (i + 1) * chunk)), part: i, parts };
    if (opts.mime) f.mime = opts.mime;
    if (opts.filename) f.filename = opts.filename;
    if (opts.caption) f.caption = opts.caption;
    frames.push(f);
  }
  return frames;
}

// ../../pkg/web/client/app.ts
var $ = (id) => document.getElementById(id);
var login = $("login");
var chat = $("chat");
var messages = $("messages");
var text = $("text");
var statusEl = $("status");
var typingEl = $("typing");
var errorEl = $("error");
var avatar = $("avatar");
var announcer = $("announce");
var loginError = $("login-error");
var server = $("server");
var client = null;
function deviceId() {
  let id = sessionStorage.getItem("hermes.device");
  if (!id) {
    id = "web-" + newId().slice(0, 12);
    sessionStorage.setItem("hermes.device", id);
  }
  return id;
}
var announced = /* @__PURE__ */ new Set();
function announce(key, text2) {
  if (announced.has(key)) return;
  announced.add(key);
  announcer.textContent = text2;
}
function wsURL() {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
}
function scrollDown() {
  messages.scrollTop = messages.scrollHeight;
}
function bubble(cls, id) {
  const el = document.createElement("div");
  el.className = "msg " + cls;
  if (id) el.dataset.id = id;
  messages.append(el);
  scrollDown();
  return el;
}
function markdown(el, src) {
  el.replaceChildren();
  const blocks = src.split(/```/);
  blocks.forEach((b, i) => {
    if (i % 2 === 1) {
      const pre = document.createElement("pre");
      pre.append(Object.assign(document.createElement("code"), { textContent: b.replace(/^[\w+-]*\n/, "") }));
      el.append(pre);
    } else {
      inline(el, b);
    }
  });
}
var INLINE = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|(?<![\w*])[*_]([^*_\n]+)[*_](?![\w*])|\[([^\]\n]+)\]\((https?:\/\/[^)\s]+)\)/g;
function inline(el, s) {
  let at = 0;
  for (const m of s.matchAll(INLINE)) {
    el.append(s.slice(at, m.index));
    at = m.index + m[0].length;
    if (m[1] !== void 0) el.append(Object.assign(document.createElement("code"), { textContent: m[1] }));
    else if (m[2] !== void 0) el.append(Object.assign(document.createElement("strong"), { textContent: m[2] }));
    else if (m[3] !== void 0) el.append(Object.assign(document.createElement("em"), { textContent: m[3] }));
    else el.append(Object.assign(document.createElement("a"), { textContent: m[4], href: m[5], target: "_blank", rel: "noopener noreferrer" }));
  }
  el.append(s.slice(at));
}
var KEEP = 50;
var kept = [];
try {
  const v = JSON.parse(sessionStorage.getItem("hermes.history") || "[]");
  if (Array.isArray(v)) kept = v.filter((h) => h && (h.who === "me" || h.who === "agent") && typeof h.id === "string" && typeof h.text === "string");
} catch {
  kept = [];
}
function keep(who, id, text2) {
  const h = kept.find((x) => x.who === who && x.id === id);
  if (h) h.text = text2;
  else kept.push({ who, id, text: text2 });
  if (kept.length > KEEP) kept = kept.slice(-KEEP);
  try {
    sessionStorage.setItem("hermes.history", JSON.stringify(kept));
  } catch {
  }
}
function restore() {
  for (const h of kept) {
    if (h.who === "agent") {
      const el = bubble("agent final", h.id);
      markdown(el, h.text);
    } else {
      bubble("me kept", h.id).append(document.createTextNode(h.text));
    }
  }
}
function forget() {
  kept = [];
  sessionStorage.removeItem("hermes.history");
  messages.replaceChildren();
}
function showMessage(m) {
  let el = messages.querySelector(`.msg.agent[data-id="${CSS.escape(m.id)}"]`);
  if (!el) el = bubble("agent", m.id);
  keep("agent", m.id, m.text);
  markdown(el, m.text);
  el.classList.toggle("streaming", !m.final);
  el.classList.toggle("final", m.final);
  el.setAttribute("aria-busy", String(!m.final));
  if (m.final) announce(m.id, m.text);
  scrollDown();
}
function showMedia(f) {
  const el = bubble("agent media", f.id);
  el.classList.add("final");
  const src = f.data ? URL.createObjectURL(new Blob([f.data], { type: f.mime || "application/octet-stream" })) : f.url || "";
  let node;
  if (f.kind === "image" || f.kind === "animation") {
    node = Object.assign(document.createElement("img"), { src, alt: f.filename || f.kind });
  } else if (f.kind === "voice") {
    node = Object.assign(document.createElement("audio"), { src, controls: true });
  } else if (f.kind === "video") {
    node = Object.assign(document.createElement("video"), { src, controls: true });
  } else {
    node = Object.assign(document.createElement("a"), { href: src, download: f.filename || f.id, textContent: "\u2B07 " + (f.filename || f.id) });
  }
  el.append(node);
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = `${f.filename || f.kind} \xB7 ${f.size} bytes${f.caption ? " \xB7 " + f.caption : ""}`;
  el.append(meta);
  announce(f.id, "File: " + meta.textContent);
}
function showPrompt(p) {
  const el = document.createElement("div");
  el.className = "card";
  el.dataset.id = p.id;
  el.append(Object.assign(document.createElement("div"), { className: "title", textContent: p.text }));
  if (p.command) el.append(Object.assign(document.createElement("code"), { textContent: p.command }));
  if (p.description) el.append(Object.assign(document.createElement("div"), { className: "desc", textContent: p.description }));
  const opts = document.createElement("div");
  opts.className = "options";
  for (const o of p.options) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = o.label;
    b.dataset.option = o.id;
    if (o.style === "danger") b.className = "danger";
    else if (o.style !== "primary") b.className = "ghost";
    b.onclick = () => {
      if (o.id === "other") {
        const answer = prompt(p.text);
        if (!answer) return;
        client?.answer(p.id, "other", answer);
      } else {
        client?.answer(p.id, o.id);
      }
      b.classList.add("chosen");
      opts.querySelectorAll("button").forEach((x) => x.disabled = true);
    };
    opts.append(b);
  }
  el.append(opts);
  messages.append(el);
  announce(p.id, p.text + (p.command ? ": " + p.command : ""));
  scrollDown();
}
function promptDone(id, option, expired) {
  const el = messages.querySelector(`.card[data-id="${CSS.escape(id)}"]`);
  if (!el) return;
  el.querySelectorAll("button").forEach((x) => x.disabled = true);
  el.classList.add("closed");
  el.append(Object.assign(document.createElement("div"), { className: "done", textContent: expired ? "expired" : "answered: " + (option ?? "") }));
}
function setAvatar(state) {
  document.body.dataset.avatar = state;
  avatar.contentWindow?.postMessage({ t: "avatar", state }, "*");
}
function showError(e) {
  errorEl.textContent = e instanceof HermesError ? e.message : String(e);
  const id = e instanceof HermesError ? e.id : void 0;
  const mine2 = id ? messages.querySelector(`.msg.me[data-id="${CSS.escape(id)}"]`) : null;
  if (mine2 && e.code === "internal_error") setSendState(mine2, "failed", "not sent");
}
function mine(cls, id, label) {
  const el = bubble("me " + cls, id);
  el.append(document.createTextNode(label), Object.assign(document.createElement("span"), { className: "state" }));
  setSendState(el, "pending", "sending\u2026");
  return el;
}
function setSendState(el, state, label) {
  el.classList.remove("pending", "sent", "failed");
  el.classList.add(state);
  const s = el.querySelector(".state");
  if (s) s.textContent = label;
}
var STATUS = { connecting: "connecting\u2026", open: "connected", closed: "not connected" };
function start(token, name, url) {
  client?.close();
  const c = new Client({ url, token, device: { id: deviceId(), name, platform: "web", app_version: "1.0.0" }, user: { name } });
  client = c;
  window.hermes = c;
  c.on("state", (s) => {
    statusEl.textContent = STATUS[s] ?? s;
    document.body.dataset.state = s;
  });
  c.on("ready", (r) => {
    if (r.avatar_url && avatar.src !== r.avatar_url) avatar.src = r.avatar_url;
  });
  c.on("message", showMessage);
  c.on("media", showMedia);
  c.on("prompt", showPrompt);
  c.on("promptDone", (d) => promptDone(d.id, d.option_id, d.expired));
  c.on("avatar", setAvatar);
  c.on("typing", (on) => typingEl.hidden = !on);
  c.on("acknowledged", (id) => {
    const el = messages.querySelector(`.msg.me[data-id="${CSS.escape(id)}"]`);
    if (el) setSendState(el, "sent", "\u2713 sent");
  });
  c.on("error", showError);
  c.on("disconnected", (d) => {
    if (client !== c || d.reconnect || d.reason === "closed by the app") return;
    statusEl.textContent = d.code === 1e3 ? "replaced" : "disconnected";
    errorEl.textContent = d.code === 1e3 ? "This device connected again elsewhere (another tab or window); this one has stopped. Reload to take it back." : `Disconnected: ${d.reason || d.code}`;
  });
  c.connect().then(
    () => {
      sessionStorage.setItem("hermes.token", token);
      sessionStorage.setItem("hermes.server", url);
      localStorage.setItem("hermes.name", name);
      login.hidden = true;
      chat.hidden = false;
      errorEl.textContent = "";
      text.focus();
    },
    (e) => {
      loginError.textContent = e instanceof HermesError && e.code === "auth_failed" ? "No access: check the token." : e instanceof HermesError && e.code === "connect_failed" ? `Cannot connect to ${url}: ${e.message.replace(/^connect_failed: /, "")}` : String(e.message ?? e);
      login.hidden = false;
      chat.hidden = true;
    }
  );
}
login.onsubmit = (e) => {
  e.preventDefault();
  loginError.textContent = "";
  start($("token").value.trim(), $("device").value.trim() || "Browser", server.value.trim() || wsURL());
};
$("logout").onclick = () => {
  client?.close();
  client = null;
  sessionStorage.removeItem("hermes.token");
  forget();
  chat.hidden = true;
  login.hidden = false;
};
$("composer").onsubmit = (e) => {
  e.preventDefault();
  const t = text.value;
  if (!client || !t.trim()) return;
  try {
    const id = client.sendText(t);
    mine("", id, t);
    keep("me", id, t);
    text.value = "";
    errorEl.textContent = "";
  } catch (err) {
    showError(err);
  }
};
text.onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
};
var lastTyping = 0;
text.oninput = () => {
  if (client && Date.now() - lastTyping > 2e3) {
    lastTyping = Date.now();
    client.sendTyping();
  }
};
function kindOf(mime) {
  if (mime.startsWith("image/")) return "image";
  if (mime.startsWith("video/")) return "video";
  if (mime.startsWith("audio/")) return "audio";
  return "document";
}
async function sendBlob(blob, filename, kind) {
  if (!client) return;
  try {
    const data = new Uint8Array(await blob.arrayBuffer());
    const id = client.sendFile(data, { kind: kind ?? kindOf(blob.type), mime: blob.type || void 0, filename });
    mine("file", id, `${filename} \xB7 ${data.length} bytes`);
    errorEl.textContent = "";
  } catch (err) {
    showError(err);
  }
}
var fileInput = $("file");
$("attach").onclick = () => fileInput.click();
fileInput.onchange = async () => {
  for (const f of Array.from(fileInput.files ?? [])) await sendBlob(f, f.name);
  fileInput.value = "";
};
var recorder = null;
var recordBtn = $("record");
recordBtn.onclick = async () => {
  if (recorder) {
    recorder.stop();
    return;
  }
  if (!navigator.mediaDevices?.getUserMedia || typeof MediaRecorder === "undefined") {
    showError("voice recording is not available in this browser");
    return;
  }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const ogg = MediaRecorder.isTypeSupported("audio/ogg;codecs=opus");
    const rec = new MediaRecorder(stream, ogg ? { mimeType: "audio/ogg;codecs=opus" } : void 0);
    const parts = [];
    rec.ondataavailable = (e) => parts.push(e.data);
    rec.onstop = async () => {
      stream.getTracks().forEach((t) => t.stop());
      recorder = null;
      recordBtn.classList.remove("recording");
      const blob = new Blob(parts, { type: rec.mimeType });
      if (!client || blob.size === 0) return;
      if (ogg) {
        try {
          const id = client.sendVoice(new Uint8Array(await blob.arrayBuffer()), "ogg");
          mine("voice", id, `voice note \xB7 ${blob.size} bytes`);
        } catch (err) {
          showError(err);
        }
      } else {
        await sendBlob(blob, "voice." + (rec.mimeType.includes("webm") ? "webm" : "audio"), "audio");
      }
    };
    recorder = rec;
    recordBtn.classList.add("recording");
    rec.start();
  } catch (err) {
    showError(err);
  }
};
$("device").value = localStorage.getItem("hermes.name") ?? "";
server.value = sessionStorage.getItem("hermes.server") || wsURL();
var keptToken = sessionStorage.getItem("hermes.token");
if (keptToken) {
  restore();
  start(keptToken, localStorage.getItem("hermes.name") || "Browser", server.value);
} else {
  forget();
}
