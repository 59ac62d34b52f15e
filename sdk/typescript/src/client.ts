// Client: one phone's connection to the gateway, kept up across drops.

import {
  AudioFormat,
  AvatarState,
  ClientFrame,
  Device,
  DeliverMedia,
  ErrorFrame,
  HermesError,
  MAX_AUDIO_BYTES,
  MAX_ID_CHARS,
  MAX_MEDIA_BYTES,
  MAX_MEDIA_PARTS,
  MAX_PUSH_TOKEN_BYTES,
  MAX_TEXT_CHARS,
  MEDIA_CHUNK_BYTES,
  MIN_MEDIA_CHUNK_BYTES,
  MediaDownFrame,
  MediaKindIn,
  MediaKindOut,
  MediaUpFrame,
  MessageFrame,
  PromptDoneFrame,
  PromptFrame,
  PushKind,
  ReadyFrame,
  ServerFrame,
  User,
  charCount,
  fromBase64,
  newId,
  toBase64,
} from "./protocol.js";
import { MAX_RETRY_AFTER, Random, parseRetryAfter, retryDelay } from "./backoff.js";

/** The constructor of a WHATWG-style WebSocket (the browser's, Node 22's, or the ws package's). */
export type WebSocketLike = new (url: string) => any;

export interface ClientOptions {
  /** ws(s)://host:port/ws */
  url: string;
  /** The app token, a device's token, or an owner's app or device key (hmt_<owner>.<key id>.<secret>): sent as it is in hello. */
  token: string;
  /** Always set device.id: it is the session address (mobile:<id>). */
  device: Device;
  user?: User;
  /** Defaults to globalThis.WebSocket; in Node 20 pass the ws package's WebSocket. */
  WebSocket?: WebSocketLike;
  /** Reconnect after a drop (default true). */
  reconnect?: boolean;
  /**
   * First and largest reconnect window, ms (default 500 and 30000): the
   * pause before a reconnect is drawn from [0, min(maxDelay, minDelay·2^attempt)]
   * (full jitter); after an upgrade refused with 503 or 429 and a
   * Retry-After, it is Retry-After plus that draw. docs/clients.md.
   */
  minDelay?: number;
  maxDelay?: number;
  /** No reconnect pause is longer than this, ms, whatever Retry-After says (default 300000: 5 minutes). */
  maxRetryAfter?: number;
  /**
   * Where the WebSocket cannot show the HTTP status of a refused upgrade
   * (a browser's, Node's built-in one), an attempt that failed before the
   * socket opened is taken as a 503 with this Retry-After, ms (default
   * 1000, the edge's smallest): the pause is this plus the full jitter.
   */
  assumedRetryAfter?: number;
  /** The backoff starts again from the first window once a connection has been ready this long, ms (default 10000). */
  stableAfter?: number;
  /** The random source of the jitter, in [0, 1) (default Math.random; a seeded one in tests). */
  random?: Random;
  /** Waits ms before a reconnect; resolves early when signal aborts (default setTimeout). */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  /** The clock of stableAfter, ms (default Date.now). */
  now?: () => number;
  /** Keepalive ping every so many ms (default 25000; 0 disables). */
  pingInterval?: number;
  /** A connection whose pong does not come within so many ms is dropped (default 15000). */
  pongTimeout?: number;
  /** Send ack{id} for each final message and each complete file handed to the app (default true). */
  autoAck?: boolean;
  /** The typing indicator clears after so many ms without a typing frame (default 6000). */
  typingIdle?: number;
  /** A socket not open within so many ms is given up (default 10000). */
  connectTimeout?: number;
  /** An open socket without ready within so many ms is dropped (default 10000). */
  readyTimeout?: number;
  /** Sends of one text or file that may meet internal_error before it is given up (default 8). */
  maxResends?: number;
  /** Called before each connection's hello for a fresh token (token refresh); the token option is used without it. */
  getToken?: () => string | Promise<string>;
  /** Where the client says what it does and what went wrong (default: errors of handlers to console.error). */
  logger?: Logger;
}

export type LogLevel = "debug" | "info" | "warn" | "error";
export type Logger = (level: LogLevel, message: string, data?: unknown) => void;

const consoleLogger: Logger = (level, message, data) => {
  if (level === "error") console.error("hermes:", message, data ?? "");
};

/** One event as the async iterator of Client.events() yields it. */
export type ClientEvent = { [K in keyof ClientEvents]: { type: K; value: ClientEvents[K] } }[keyof ClientEvents];

/** Why a socket closed: the close code (1006 when none came) and reason, and whether the client reconnects. */
export interface Disconnected {
  code: number;
  reason: string;
  reconnect: boolean;
}

/** A reconnect about to wait: after which failure, for how long, and why. */
export interface Retry {
  /** Failed attempts in a row before this pause (0: the first retry). */
  attempt: number;
  /** The pause, ms. */
  delay: number;
  /** The HTTP status of a refused upgrade, when the WebSocket could show it. */
  status?: number;
  /** The Retry-After of that refusal, ms, or the assumed one where the status cannot be seen. */
  retryAfter?: number;
  /** What failed. */
  reason: string;
}

/** How a connection attempt ended before the socket opened: the HTTP answer of a refused upgrade. */
interface Refusal {
  status: number;
  retryAfter?: number;
}

const defaultSleep = (ms: number, signal: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });

export interface Message {
  id: string;
  text: string;
  final: boolean;
  edit: boolean;
}

export interface MediaFile {
  id: string;
  kind: MediaKindOut;
  mime: string;
  filename: string;
  caption?: string;
  size: number;
  /** The file's bytes, when it came inline. */
  data?: Uint8Array;
  /** A link to download it from, when it came by link. */
  url?: string;
  reply_to?: string;
}

export interface FileOptions {
  kind: MediaKindIn;
  mime?: string;
  filename?: string;
  caption?: string;
  id?: string;
  /** Bytes per part, between 4 KiB and 3 MiB (default 3 MiB). */
  chunkBytes?: number;
}

export type ConnectionState = "connecting" | "open" | "closed";

export interface ClientEvents {
  ready: ReadyFrame;
  state: ConnectionState;
  /** A socket closed: code 1000 is "replaced by a newer connection of this device" (no reconnect), 1001 a node going down. */
  disconnected: Disconnected;
  /** The client waits before its next connection attempt (a drop, a refused or failed attempt). */
  retry: Retry;
  /** A message as assembled so far: every chunk or edit re-emits it whole. */
  message: Message;
  media: MediaFile;
  /** Progress of an incoming file: parts received of parts. */
  mediaProgress: { id: string; part: number; parts: number };
  prompt: PromptFrame;
  promptDone: PromptDoneFrame;
  avatar: AvatarState;
  typing: boolean;
  delivered: { id: string; device: string };
  /** The gateway stored (registered) or took back the app's push token of kind. */
  push: { kind: PushKind; registered: boolean };
  error: HermesError;
  /** Every frame received, decoded. */
  frame: ServerFrame;
  /** Every frame written (for logs and tests). */
  sent: ClientFrame;
  /** Texts and files the gateway has taken (a pong after them came back). */
  acknowledged: string;
}

type Handler<T> = (v: T) => void;

const ALL_EVENTS: (keyof ClientEvents)[] = [
  "ready", "state", "disconnected", "retry", "message", "media", "mediaProgress", "prompt", "promptDone",
  "avatar", "typing", "delivered", "push", "error", "frame", "sent", "acknowledged",
];

interface Outgoing {
  id: string;
  frames: ClientFrame[];
  seq: number; // send sequence on the current socket; 0: not written
  sends: number; // writes that met an internal_error
}

interface PendingPing {
  sentAt: number;
  mark: number;
  writes: number;
  resolve: (rtt: number) => void;
  reject: (e: Error) => void;
  timer: any;
}

interface PendingPush {
  kind: PushKind;
  resolve: () => void;
  reject: (e: Error) => void;
  timer: any;
}

interface Incoming {
  meta: MediaDownFrame;
  parts: (Uint8Array | undefined)[];
  got: number;
}

/** Check a Uint8Array-ish value. */
function bytesOf(b: Uint8Array | ArrayBuffer): Uint8Array {
  return b instanceof Uint8Array ? b : new Uint8Array(b);
}

function local(code: string, message: string): HermesError {
  return new HermesError(code, message, { local: true });
}

/**
 * A Protocol v1 client. It says hello on every connection, reconnects with
 * full-jitter exponential backoff that honours the edge's Retry-After
 * (docs/clients.md), and resends, with the same ids, the texts,
 * voice notes and files the gateway has not yet confirmed taking (the
 * gateway drops duplicates by id). A frame counts as taken when the pong of
 * a ping written after it comes back on the same socket without an
 * internal_error in between: the gateway handles a socket's frames in order.
 */
export class Client {
  readonly opts: Required<Omit<ClientOptions, "user" | "WebSocket" | "getToken">> & Pick<ClientOptions, "user" | "WebSocket" | "getToken">;
  /** The last ready frame; null before the first. */
  readyFrame: ReadyFrame | null = null;
  state: ConnectionState = "closed";
  avatar: AvatarState = "idle";
  typing = false;

  private ws: any = null;
  private handlers = new Map<string, Set<Handler<any>>>();
  private outbox = new Map<string, Outgoing>();
  private seq = 0;
  private pings = new Map<number, PendingPing>();
  private lastTs = 0;
  private transientError = false;
  private messages = new Map<string, string>();
  private incoming = new Map<string, Incoming>();
  private attempt = 0;
  private stopped = true;
  private retryWait: AbortController | null = null; // the pause before the next attempt
  private opened = false; // the current socket opened
  private seesStatus = false; // the current socket shows the HTTP answer of a refused upgrade
  private refusal: Refusal | null = null; // the current attempt's refused upgrade
  private readyAt = 0;
  private keepalive: any = null;
  private typingTimer: any = null;
  private firstReady: { resolve: (r: ReadyFrame) => void; reject: (e: Error) => void } | null = null;
  private openTimer: any = null;
  private failure = ""; // why the current socket is failing, for connect()'s error
  private gotReady = false; // on the current socket
  private offline: ClientFrame[] = []; // card answers and deliveries written after the next ready
  private resendTimer: any = null;
  private closers = new Set<() => void>(); // ends the events() iterators
  private writes = 0; // frames written on this socket
  private unconfirmed: { id: string; n: number }[] = []; // ids written since the last pong, for errors
  private pushes: PendingPush[] = []; // push frames written and not answered, in order

  constructor(opts: ClientOptions) {
    this.opts = {
      reconnect: true,
      minDelay: 500,
      maxDelay: 30000,
      pingInterval: 25000,
      pongTimeout: 15000,
      autoAck: true,
      typingIdle: 6000,
      connectTimeout: 10000,
      readyTimeout: 10000,
      maxResends: 8,
      maxRetryAfter: MAX_RETRY_AFTER,
      assumedRetryAfter: 1000,
      stableAfter: 10000,
      random: Math.random,
      sleep: defaultSleep,
      now: () => Date.now(),
      logger: consoleLogger,
      ...opts,
      device: { ...opts.device, id: opts.device?.id || "dev-" + newId().slice(0, 12) },
    };
  }

  on<K extends keyof ClientEvents>(type: K, fn: Handler<ClientEvents[K]>): () => void {
    let set = this.handlers.get(type);
    if (!set) this.handlers.set(type, (set = new Set()));
    set.add(fn);
    return () => set!.delete(fn);
  }

  /** Like on(), for the first event only. */
  once<K extends keyof ClientEvents>(type: K, fn: Handler<ClientEvents[K]>): () => void {
    const off = this.on(type, (v) => {
      off();
      fn(v);
    });
    return off;
  }

  /** Removes a handler given to on(). */
  off<K extends keyof ClientEvents>(type: K, fn: Handler<ClientEvents[K]>): void {
    this.handlers.get(type)?.delete(fn);
  }

  /**
   * The events of the given types (all when none) as an async iterator, in
   * order, from now until close() or until signal aborts:
   * `for await (const ev of c.events(["message"])) ...`. Events wait in the
   * iterator until read.
   */
  events(types?: (keyof ClientEvents)[], opts: { signal?: AbortSignal } = {}): AsyncIterableIterator<ClientEvent> {
    const queue: ClientEvent[] = [];
    let wake: (() => void) | null = null;
    let done = false;
    const offs: (() => void)[] = [];
    const finish = () => {
      done = true;
      offs.forEach((off) => off());
      wake?.();
    };
    for (const type of types ?? ALL_EVENTS) {
      offs.push(
        this.on(type, (value: any) => {
          queue.push({ type, value } as ClientEvent);
          wake?.();
        }),
      );
    }
    this.closers.add(finish);
    offs.push(() => this.closers.delete(finish));
    if (opts.signal?.aborted) finish();
    opts.signal?.addEventListener("abort", finish, { once: true });
    const it: AsyncIterableIterator<ClientEvent> = {
      [Symbol.asyncIterator]: () => it,
      next: async () => {
        while (!queue.length && !done) await new Promise<void>((r) => (wake = r));
        wake = null;
        if (queue.length) return { value: queue.shift()!, done: false };
        return { value: undefined, done: true };
      },
      return: async () => {
        finish();
        queue.length = 0;
        return { value: undefined, done: true };
      },
    };
    return it;
  }

  private emit<K extends keyof ClientEvents>(type: K, v: ClientEvents[K]): void {
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
  get pending(): string[] {
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
  connect(opts: { signal?: AbortSignal } = {}): Promise<ReadyFrame> {
    if (!this.stopped) return Promise.reject(local("bad_frame", "already connected"));
    const signal = opts.signal;
    if (signal?.aborted) return Promise.reject(local("cancelled", "connect() cancelled"));
    this.stopped = false;
    this.attempt = 0;
    const p = new Promise<ReadyFrame>((resolve, reject) => (this.firstReady = { resolve, reject }));
    if (signal) {
      // Cancelling connect() closes the client; after ready the signal does nothing.
      const abort = () => {
        if (!this.firstReady) return;
        this.failFirst(local("cancelled", "connect() cancelled"));
        this.close();
      };
      signal.addEventListener("abort", abort, { once: true });
      p.then(
        () => signal.removeEventListener("abort", abort),
        () => signal.removeEventListener("abort", abort),
      );
    }
    this.opts.logger("info", `connecting to ${this.opts.url}`);
    this.open();
    return p;
  }

  /** Closes the connection and stops reconnecting. Unconfirmed sends stay pending for the next connect(). */
  close(): void {
    this.stopped = true;
    for (const end of [...this.closers]) end();
    this.cancelRetry();
    clearTimeout(this.resendTimer);
    this.failFirst(local("internal_error", "closed"));
    if (this.ws) {
      const ws = this.ws;
      this.detach();
      try {
        ws.close(1000);
      } catch {}
      this.emit("disconnected", { code: 1000, reason: "closed by the app", reconnect: false });
    }
    this.setState("closed");
  }

  /** Drops the socket as a lost network would; the client reconnects (for tests and "retry now" buttons). */
  drop(): void {
    if (!this.ws) return;
    const ws = this.ws;
    try {
      if (typeof ws.terminate === "function") ws.terminate();
      else ws.close(4000, "dropped");
    } catch {}
    this.onClose(1006, "");
  }

  private giveUp(why: string): void {
    this.failure = why;
    this.drop();
  }

  private open(): void {
    const WS = this.opts.WebSocket ?? (globalThis as any).WebSocket;
    if (!WS) throw local("internal_error", "no WebSocket: pass the ws package's WebSocket in options.WebSocket");
    this.setState("connecting");
    let ws: any;
    this.failure = "";
    this.gotReady = false;
    this.opened = false;
    this.seesStatus = false;
    this.refusal = null;
    try {
      ws = new WS(this.opts.url);
    } catch (e: any) {
      this.failure = `cannot open ${this.opts.url}: ${e?.message ?? e}`;
      this.onClose(1006, "");
      return;
    }
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    this.seesStatus = typeof ws.on === "function";
    if (this.seesStatus) {
      // The ws package hands over the HTTP answer of a refused upgrade (a
      // 503 and its Retry-After); a browser's WebSocket shows nothing of it.
      ws.on("unexpected-response", (_req: any, res: any) => {
        if (this.ws === ws) {
          const retryAfter = parseRetryAfter(res.headers?.["retry-after"], this.opts.now());
          this.refusal = { status: res.statusCode, retryAfter };
          this.failure = `upgrade refused with HTTP ${res.statusCode}` + (retryAfter !== undefined ? `, Retry-After ${retryAfter / 1000} s` : "");
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
        } catch (e: any) {
          if (this.ws === ws) this.giveUp(`getToken failed: ${e?.message ?? e}`);
          return;
        }
        if (this.ws !== ws) return;
      }
      const hello: ClientFrame = { t: "hello", token, device: this.opts.device };
      if (this.opts.user) hello.user = this.opts.user;
      this.write(hello);
    };
    ws.onmessage = (ev: any) => {
      let text = ev.data;
      if (typeof text !== "string") text = new TextDecoder().decode(bytesOf(text));
      let f: any;
      try {
        f = JSON.parse(text);
      } catch {
        return;
      }
      if (f && typeof f === "object" && typeof f.t === "string") this.handle(f as ServerFrame);
    };
    ws.onclose = (ev: any) => {
      if (this.ws === ws) this.onClose(ev?.code ?? 1006, ev?.reason ?? "");
    };
    ws.onerror = (ev: any) => {
      if (!this.failure) this.failure = ev?.message || ev?.error?.message || `cannot connect to ${this.opts.url}`;
    };
  }

  private detach(): void {
    if (!this.ws) return;
    this.ws.onopen = this.ws.onmessage = this.ws.onclose = null;
    this.ws.onerror = () => {}; // ws emits one for a socket ended while connecting

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
    // Half-received files are sent again whole after a reconnect.
    this.incoming.clear();
  }

  private onClose(code: number, reason: string): void {
    this.detach();
    if (this.gotReady && this.opts.now() - this.readyAt >= this.opts.stableAfter) this.attempt = 0;
    if (code === 1008 && (reason === "auth_failed" || reason === "forbidden")) {
      this.stop(new HermesError(reason, "connection refused", { fatal: true }));
    } else if (!this.gotReady && this.firstReady && !this.shed()) {
      // The first connection of connect() failed: say so rather than retry unseen.
      const why = this.failure || (code === 1006 ? `cannot connect to ${this.opts.url}` : `closed with ${code} ${reason}`.trim());
      const err = local("connect_failed", why);
      this.emit("error", err);
      this.stop(err);
    } else if (code === 1000) {
      // The gateway closes with 1000 only when a newer connection of this
      // device took over: reconnecting would take it back, and so on.
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

  private stop(err: HermesError): void {
    this.stopped = true;
    for (const end of [...this.closers]) end();
    this.cancelRetry();
    this.failFirst(err);
    this.setState("closed");
  }

  private failFirst(err: Error): void {
    if (this.firstReady) {
      this.firstReady.reject(err);
      this.firstReady = null;
    }
  }

  /** The edge shed this attempt (503 or 429 before the upgrade): it is there, and says come back later. */
  private shed(): boolean {
    return this.opts.reconnect && this.refusal !== null && (this.refusal.status === 503 || this.refusal.status === 429);
  }

  private scheduleRetry(): void {
    this.setState(this.opts.reconnect ? "connecting" : "closed");
    if (!this.opts.reconnect) {
      this.stop(local("internal_error", "connection lost"));
      return;
    }
    const retry: Retry = { attempt: this.attempt, delay: 0, reason: this.failure || "connection lost" };
    let floor: number | undefined;
    if (this.refusal) {
      retry.status = this.refusal.status;
      if (this.shed() && this.refusal.retryAfter !== undefined) floor = retry.retryAfter = this.refusal.retryAfter;
    } else if (!this.opened && !this.seesStatus) {
      // A browser cannot tell a refused upgrade from an unreachable edge: take it as the smallest Retry-After.
      floor = retry.retryAfter = this.opts.assumedRetryAfter;
    }
    retry.delay = retryDelay(
      { attempt: this.attempt++, base: this.opts.minDelay, cap: this.opts.maxDelay, floor, max: this.opts.maxRetryAfter },
      this.opts.random,
    );
    this.cancelRetry();
    const wait = (this.retryWait = new AbortController());
    this.opts.logger("debug", `reconnecting in ${Math.round(retry.delay)} ms`, retry);
    this.emit("retry", retry);
    if (this.stopped || wait.signal.aborted) return; // a retry handler closed the client
    this.opts.sleep(retry.delay, wait.signal).then(
      () => {
        if (this.retryWait !== wait || wait.signal.aborted || this.stopped) return;
        this.retryWait = null;
        this.open();
      },
      (e) => this.opts.logger("error", "sleep failed", e),
    );
  }

  private cancelRetry(): void {
    this.retryWait?.abort();
    this.retryWait = null;
  }

  private setState(s: ConnectionState): void {
    if (this.state === s) return;
    this.state = s;
    this.emit("state", s);
  }

  private write(f: ClientFrame): boolean {
    if (!this.ws || this.ws.readyState !== 1) return false;
    this.ws.send(JSON.stringify(f));
    this.writes++;
    const id = f.t === "prompt" ? f.prompt_id : f.t === "text" || f.t === "audio" || f.t === "deliver" || (f.t === "media" && !f.part) ? f.id : "";
    if (id) this.unconfirmed.push({ id, n: this.writes });
    this.emit("sent", f);
    return true;
  }

  private handle(f: ServerFrame): void {
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
          this.keepalive = setInterval(() => this.ping().catch(() => {}), this.opts.pingInterval);
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
        this.avatar = (["idle", "thinking", "speaking"].includes(f.state) ? f.state : "idle") as AvatarState;
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
      // Unknown frame types are ignored, as the protocol asks.
    }
  }

  private onError(f: ErrorFrame): void {
    // An error to a push frame says so first ("push…"): it fails the
    // oldest unanswered registration, and no text or file.
    if (this.pushes.length > 0 && !f.fatal && (f.message ?? "").startsWith("push")) {
      const p = this.pushes.shift()!;
      clearTimeout(p.timer);
      const err = new HermesError(f.code, f.message ?? "");
      p.reject(err);
      this.emit("error", err);
      return;
    }
    // Error frames carry no id; the gateway answers a socket's frames in
    // order, so when one frame with an id is unconfirmed, it is the one.
    const ids = new Set(this.unconfirmed.map((u) => u.id));
    const err = new HermesError(f.code, f.message ?? "", { fatal: !!f.fatal, id: ids.size === 1 ? [...ids][0] : undefined });
    if (f.code === "internal_error") this.transientError = true;
    if (err.permanent && err.fatal) this.stop(err);
    this.emit("error", err);
  }

  private setTyping(on: boolean): void {
    clearTimeout(this.typingTimer);
    if (on) this.typingTimer = setTimeout(() => this.setTyping(false), this.opts.typingIdle);
    if (this.typing !== on) {
      this.typing = on;
      this.emit("typing", on);
    }
  }

  private onMessage(f: MessageFrame): void {
    const index = f.chunk?.index ?? 0;
    const text = index === 0 ? f.text ?? "" : (this.messages.get(f.id) ?? "") + (f.text ?? "");
    if (f.final) this.messages.delete(f.id);
    else this.messages.set(f.id, text);
    this.emit("message", { id: f.id, text, final: !!f.final, edit: !!f.edit });
    if (f.final) {
      this.setTyping(false);
      this.ack(f.id);
    }
  }

  private onMedia(f: MediaDownFrame): void {
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
      // The last part came without some earlier ones: not a file to hand over, nor to ack.
      this.emit("error", new HermesError("bad_frame", `incoming file ${f.id}: ${inc.got} of ${parts} parts`, { local: true, id: f.id }));
      return;
    }
    const m = inc.meta;
    const file: MediaFile = { id: f.id, kind: m.kind, mime: m.mime, filename: m.filename, size: m.size };
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
  ack(id: string, force = false): void {
    if (this.opts.autoAck || force) this.write({ t: "ack", id });
  }

  // Sending.

  private checkId(id: string | undefined): string {
    const v = id || newId("c-");
    if (v.length > MAX_ID_CHARS) throw local("bad_frame", `id longer than ${MAX_ID_CHARS} characters`);
    return v;
  }

  private enqueue(id: string, frames: ClientFrame[]): string {
    this.outbox.set(id, { id, frames, seq: 0, sends: 0 });
    if (this.state === "open") this.flush();
    return id;
  }

  /** Writes what is pending and not yet written on this socket, then a ping to learn it was taken. */
  private flush(): void {
    let wrote = false;
    for (const o of this.outbox.values()) {
      if (o.seq !== 0) continue;
      for (const f of o.frames) if (!this.write(f)) return;
      o.seq = ++this.seq;
      wrote = true;
    }
    if (wrote) this.ping().catch(() => {});
  }

  private onPong(ts: unknown): void {
    const p = typeof ts === "number" ? this.pings.get(ts) : undefined;
    if (!p) return;
    this.pings.delete(ts as number);
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
        o.seq = 0; // written, but something failed on the way: send again, same id, after a growing pause
        sends = Math.max(sends, o.sends);
      }
    }
    if (sends > 0) {
      clearTimeout(this.resendTimer);
      const cap = Math.min(this.opts.maxDelay, this.opts.minDelay * 2 ** (sends - 1));
      this.resendTimer = setTimeout(() => this.state === "open" && this.flush(), cap / 2 + (this.opts.random() * cap) / 2);
    }
    p.resolve(Date.now() - p.sentAt);
  }

  /** Sends a text; returns its id. */
  sendText(text: string, id?: string): string {
    if (typeof text !== "string" || text.trim() === "") throw local("bad_frame", "empty text");
    const n = charCount(text);
    const max = this.capabilities?.max_text_chars ?? MAX_TEXT_CHARS;
    if (n > max) throw local("too_big", `text of ${n} characters; at most ${max}`);
    const mid = this.checkId(id);
    return this.enqueue(mid, [{ t: "text", id: mid, text }]);
  }

  /** Sends a voice recording (wav or ogg, ≤ 8 MiB); text is its transcript when you have one. */
  sendVoice(data: Uint8Array | ArrayBuffer, format: AudioFormat, opts: { text?: string; id?: string } = {}): string {
    const b = bytesOf(data);
    if (format !== "wav" && format !== "ogg") throw local("unsupported_frame", `audio format ${format}: wav or ogg`);
    if (b.length === 0) throw local("bad_frame", "empty recording");
    if (b.length > MAX_AUDIO_BYTES) throw local("too_big", `recording of ${b.length} bytes; at most ${MAX_AUDIO_BYTES}`);
    if (opts.text && charCount(opts.text) > MAX_TEXT_CHARS) throw local("too_big", `text over ${MAX_TEXT_CHARS} characters`);
    const id = this.checkId(opts.id);
    const f: ClientFrame = { t: "audio", id, format, data: toBase64(b) };
    if (opts.text) f.text = opts.text;
    return this.enqueue(id, [f]);
  }

  /** Sends a file, in parts of chunkBytes (3 MiB) when it is larger; returns its id. */
  sendFile(data: Uint8Array | ArrayBuffer, opts: FileOptions): string {
    const frames = mediaFrames(bytesOf(data), { ...opts, id: this.checkId(opts.id) }, this.capabilities?.max_media_bytes);
    return this.enqueue(frames[0].id, frames);
  }

  /** Answers a card: an option id, or a text (clarify's "other"). */
  answer(promptId: string, optionId?: string, text?: string): void {
    if (!promptId) throw local("bad_frame", "prompt_id is required");
    if (!optionId && !text) throw local("bad_frame", "an option_id or a text is required");
    const f: ClientFrame = { t: "prompt", prompt_id: promptId };
    if (optionId) f.option_id = optionId;
    if (text) f.text = text;
    this.writeOrQueue(f);
  }

  /** Writes f now, or after the next ready when not connected (card answers and deliveries). */
  private writeOrQueue(f: ClientFrame): void {
    if (this.state !== "open" || !this.write(f)) this.offline.push(f);
  }

  /** Tells the agent the user is typing. */
  sendTyping(): void {
    this.write({ t: "typing" });
  }

  /** Service delivery (cron, hermes send): only from loopback or with a deliver token. */
  deliver(opts: { target?: string; text?: string; media?: DeliverMedia; id?: string }): string {
    if (!opts.text && !opts.media) throw local("bad_frame", "deliver needs a text or a media");
    const id = this.checkId(opts.id);
    const f: ClientFrame = { t: "deliver", id };
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
  registerPush(kind: PushKind, token: string): Promise<void> {
    if (this.state !== "open") return Promise.reject(local("internal_error", "not connected: register the push token after ready"));
    const offered = this.capabilities?.push ?? [];
    if (!offered.includes(kind)) {
      return Promise.reject(local("unsupported_frame", `the gateway sends no ${kind} notifications (capabilities.push: ${offered.join(", ") || "none"})`));
    }
    if (token.length > MAX_PUSH_TOKEN_BYTES || /[^\x21-\x7e]/.test(token)) {
      return Promise.reject(local("bad_frame", `a push token is printable ASCII without spaces, at most ${MAX_PUSH_TOKEN_BYTES} bytes`));
    }
    return new Promise<void>((resolve, reject) => {
      const p: PendingPush = { kind, resolve, reject, timer: null };
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
  removePush(kind: PushKind): Promise<void> {
    return this.registerPush(kind, "");
  }

  /** Round-trip time in ms of a ping; rejects when the connection closes or no pong comes in time. */
  ping(): Promise<number> {
    return new Promise((resolve, reject) => {
      const ts = (this.lastTs = Math.max(this.lastTs + 1, Date.now()));
      const p: PendingPing = { sentAt: Date.now(), mark: this.seq, writes: this.writes, resolve, reject, timer: null };
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
}

/** The media frames of one file, with the protocol's limits checked. */
export function mediaFrames(data: Uint8Array, opts: FileOptions & { id: string }, maxBytes = MAX_MEDIA_BYTES): MediaUpFrame[] {
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
  const frames: MediaUpFrame[] = [];
  for (let i = 0; i < parts; i++) {
    const f: MediaUpFrame = { t: "media", id: opts.id, kind: opts.kind, data: toBase64(data.subarray(i * chunk, (i + 1) * chunk)), part: i, parts };
    if (opts.mime) f.mime = opts.mime;
    if (opts.filename) f.filename = opts.filename;
    if (opts.caption) f.caption = opts.caption;
    frames.push(f);
  }
  return frames;
}
