// The SDK against a real gateway (services/edge with the demo agent).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { WebSocket, WebSocketServer } from "ws";
import { createServer } from "node:net";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  Client,
  HermesError,
  mediaFrames,
  MAX_TEXT_CHARS,
  MAX_MEDIA_PARTS,
  MIN_MEDIA_CHUNK_BYTES,
  MEDIA_CHUNK_BYTES,
  MAX_MEDIA_BYTES,
  MAX_AUDIO_BYTES,
} from "../dist/esm/index.js";
import { startGateway, pushEnv } from "./gateway.js";

let gw;
before(async () => {
  gw = await startGateway();
});
after(async () => {
  await gw?.stop();
});

const clients = [];
function newClient(device, opts = {}) {
  const c = new Client({ url: gw.ws, token: gw.token, device: { id: device, name: device, platform: "test" }, WebSocket, minDelay: 50, maxDelay: 500, ...opts });
  clients.push(c);
  return c;
}
after(() => clients.forEach((c) => c.close()));

/** Resolves with the first value of event that pred accepts, within ms. */
function waitFor(c, event, pred = () => true, ms = 30000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error(`no ${event} within ${ms} ms`));
    }, ms);
    const off = c.on(event, (v) => {
      if (!pred(v)) return;
      clearTimeout(timer);
      off();
      resolve(v);
    });
  });
}

function uniq(p) {
  return p + "-" + Math.random().toString(16).slice(2, 10);
}

test("hello and ready: session, avatar page, capabilities", async () => {
  const dev = uniq("ts-ready");
  const c = newClient(dev);
  const ready = await c.connect();
  assert.equal(ready.v, 1);
  assert.equal(ready.session, "mobile:" + dev);
  assert.equal(ready.device.id, dev);
  assert.equal(ready.avatar_url, gw.http + "/avatar/");
  assert.equal(c.capabilities.max_text_chars, MAX_TEXT_CHARS);
  assert.equal(c.capabilities.max_media_bytes, MAX_MEDIA_BYTES);
  assert.deepEqual(c.capabilities.avatar_states, ["idle", "thinking", "speaking"]);
  assert.equal(c.state, "open");
});

test("a text: the streamed answer grows by edits to its final form, is acked, and the avatar and typing follow", async () => {
  const c = newClient(uniq("ts-text"));
  await c.connect();
  const seen = [];
  const avatars = [];
  let typed = false;
  c.on("message", (m) => seen.push(m));
  c.on("avatar", (s) => avatars.push(s));
  c.on("typing", (on) => on && (typed = true));
  const acks = [];
  c.on("sent", (f) => f.t === "ack" && acks.push(f.id));
  const taken = waitFor(c, "acknowledged");
  const id = c.sendText("hello there");
  const final = await waitFor(c, "message", (m) => m.final);
  assert.equal(final.text, "You said: hello there");
  assert.equal(seen[0].text, "You said: ");
  assert.ok(seen.some((m) => m.edit && !m.final && m.text.length > seen[0].text.length && m.text.length < final.text.length), "a growing edit before the final one");
  assert.ok(seen.every((m) => m.id === final.id));
  assert.deepEqual(acks, [final.id], "the final message was acked once");
  assert.equal(await taken, id);
  assert.deepEqual(c.pending, []);
  assert.ok(typed, "typing shown");
  assert.ok(avatars.includes("thinking"), "avatar thinking: " + avatars);
  await waitFor(c, "avatar", (s) => s === "speaking").catch(() => {}); // may have come already
  assert.ok(avatars.includes("speaking") || c.avatar === "speaking" || avatars.includes("idle"));
});

test("a long answer in chunks is assembled by id", async () => {
  const c = newClient(uniq("ts-long"));
  await c.connect();
  const text = "0123456789".repeat(1200); // 12000 characters: exactly the limit
  assert.equal(text.length, MAX_TEXT_CHARS);
  c.sendText(text);
  const chunks = [];
  c.on("frame", (f) => f.t === "message" && chunks.push(f));
  const final = await waitFor(c, "message", (m) => m.final);
  assert.equal(final.text, "You said: " + text);
  assert.ok(chunks.some((f) => f.chunk.total > 1 && f.chunk.index > 0), "the answer came in several chunks");
});

test("limits are checked before sending, at the boundary", () => {
  const c = newClient(uniq("ts-limits"));
  const err = (fn, code) => assert.throws(fn, (e) => e instanceof HermesError && e.code === code && e.local);
  err(() => c.sendText("x".repeat(MAX_TEXT_CHARS + 1)), "too_big");
  err(() => c.sendText("   "), "bad_frame");
  c.sendText("😀".repeat(MAX_TEXT_CHARS)); // characters, not UTF-16 units
  err(() => c.sendText("😀".repeat(MAX_TEXT_CHARS + 1)), "too_big");
  err(() => c.sendVoice(new Uint8Array(MAX_AUDIO_BYTES + 1), "wav"), "too_big");
  err(() => c.sendVoice(new Uint8Array(10), "mp3"), "unsupported_frame");
  c.sendVoice(new Uint8Array(MAX_AUDIO_BYTES), "ogg");
  err(() => c.sendFile(new Uint8Array(MAX_MEDIA_BYTES + 1), { kind: "document" }), "too_big");
  err(() => c.sendFile(new Uint8Array(10), { kind: "sticker" }), "unsupported_frame");
  err(() => c.sendFile(new Uint8Array(10), { kind: "document", chunkBytes: MIN_MEDIA_CHUNK_BYTES - 1 }), "bad_frame");
  err(() => c.sendFile(new Uint8Array(10), { kind: "document", chunkBytes: MEDIA_CHUNK_BYTES + 1 }), "bad_frame");
  err(() => c.sendText("x", "i".repeat(129)), "bad_frame");
  // Parts: exactly 2048 parts of the smallest chunk pass; one byte more is 2049 parts.
  const id = "f";
  assert.equal(mediaFrames(new Uint8Array(MIN_MEDIA_CHUNK_BYTES * MAX_MEDIA_PARTS), { kind: "document", id, chunkBytes: MIN_MEDIA_CHUNK_BYTES }).length, MAX_MEDIA_PARTS);
  err(() => mediaFrames(new Uint8Array(MIN_MEDIA_CHUNK_BYTES * MAX_MEDIA_PARTS + 1), { kind: "document", id, chunkBytes: MIN_MEDIA_CHUNK_BYTES }, MAX_MEDIA_BYTES + 1), "too_big");
  const parts = mediaFrames(new Uint8Array(MEDIA_CHUNK_BYTES + 1), { kind: "document", id });
  assert.deepEqual(parts.map((f) => [f.part, f.parts]), [[0, 2], [1, 2]]);
  assert.equal(c.pending.length, 2, "what passed is pending until connected");
});

test("a file over one part goes up in parts and comes back whole (chunked media assembled)", async () => {
  const c = newClient(uniq("ts-file"));
  await c.connect();
  const data = new Uint8Array(MEDIA_CHUNK_BYTES + 1000);
  for (let i = 0; i < data.length; i++) data[i] = (i * 31) & 0xff;
  const sent = [];
  c.on("sent", (f) => f.t === "media" && sent.push([f.part, f.parts]));
  const acks = [];
  c.on("sent", (f) => f.t === "ack" && acks.push(f.id));
  const progress = [];
  c.on("mediaProgress", (p) => progress.push(p));
  const id = c.sendFile(data, { kind: "document", mime: "application/octet-stream", filename: "big.bin", caption: "big" });
  const file = await waitFor(c, "media", () => true, 30000);
  assert.deepEqual(sent, [[0, 2], [1, 2]]);
  assert.equal(file.reply_to, id);
  assert.equal(file.filename, "big.bin");
  assert.equal(file.size, data.length);
  assert.ok(Buffer.from(file.data).equals(Buffer.from(data)), "the bytes came back unchanged");
  assert.ok(progress.length >= 1);
  assert.deepEqual(acks, [file.id]);
});

test("voice: a recording with its transcript", async () => {
  const c = newClient(uniq("ts-voice"));
  await c.connect();
  c.sendVoice(new Uint8Array(1234), "ogg", { text: "hi" });
  const m = await waitFor(c, "message", (m) => m.final);
  assert.equal(m.text, "Received audio: 1234 bytes (ogg). Recognised text: hi");
});

test("a card: options shown, answered, closed, resolved", async () => {
  const c = newClient(uniq("ts-card"));
  await c.connect();
  c.sendText("/approve ls -la");
  const card = await waitFor(c, "prompt");
  assert.equal(card.kind, "exec_approval");
  assert.equal(card.command, "ls -la");
  assert.ok(card.timeout_seconds > 0);
  assert.deepEqual(card.options.map((o) => o.id).sort(), ["always", "deny", "once", "session"]);
  const resolved = waitFor(c, "message", (m) => m.final);
  const closed = waitFor(c, "promptDone");
  c.answer(card.id, "once");
  const done = await closed;
  assert.equal(done.id, card.id);
  assert.equal(done.option_id, "once");
  const m = await resolved;
  assert.equal(m.text, "exec_approval resolved: once");

  // An unknown card closes as expired, and the connection stays.
  c.answer("no-such-card", "once");
  const gone = await waitFor(c, "promptDone", (d) => d.id === "no-such-card");
  assert.equal(gone.expired, true);
  assert.ok((await c.ping()) >= 0);
});

test("ping: a round-trip time; typing goes up without an error", async () => {
  const c = newClient(uniq("ts-ping"));
  await c.connect();
  const errors = [];
  c.on("error", (e) => errors.push(e));
  const sent = [];
  c.on("sent", (f) => sent.push(f.t));
  c.sendTyping();
  const rtt = await c.ping();
  assert.ok(rtt >= 0 && rtt < 5000, String(rtt));
  assert.deepEqual(sent, ["typing", "ping"]);
  assert.deepEqual(errors, []);
});

test("an unknown frame type is ignored", async () => {
  const c = newClient(uniq("ts-unknown"));
  await c.connect();
  const events = [];
  for (const e of ["message", "media", "prompt", "promptDone", "avatar", "typing", "delivered", "error"]) c.on(e, (v) => events.push([e, v]));
  c.handle({ t: "hologram", id: "x", text: "from a later version" });
  assert.deepEqual(events, []);
  assert.equal(c.state, "open");
  assert.ok((await c.ping()) >= 0);
});

test("deliver from loopback reaches the device; delivered comes back to the sender", async () => {
  const target = newClient(uniq("ts-target"));
  await target.connect();
  const cron = newClient(uniq("ts-cron"));
  await cron.connect();
  const id = cron.deliver({ target: target.opts.device.id, text: "reminder" });
  const [m, d] = await Promise.all([waitFor(target, "message", (m) => m.final), waitFor(cron, "delivered")]);
  assert.equal(m.text, "reminder");
  assert.deepEqual(d, { id, device: target.opts.device.id });
});

test("reconnect with jittered backoff resends what was not confirmed, with the same id", async () => {
  const c = newClient(uniq("ts-resend"));
  await c.connect();
  // An acked answer first: from then on the gateway keeps what this phone
  // has not acked, so an answer written into the dropped socket comes again.
  const warm = waitFor(c, "message", (m) => m.final);
  const warmTaken = waitFor(c, "acknowledged");
  c.sendText("warm up");
  await Promise.all([warm, warmTaken]);
  const texts = [];
  c.on("sent", (f) => f.t === "text" && texts.push(f.id));
  const finals = [];
  c.on("message", (m) => m.final && finals.push(m.text));
  // Written, then the network drops before the gateway's pong confirms it.
  const id = c.sendText("survive the drop");
  c.drop();
  assert.deepEqual(c.pending, [id]);
  assert.equal(c.state, "connecting");
  // Queued while offline.
  const id2 = c.sendText("sent while offline");
  await waitFor(c, "ready");
  await waitFor(c, "acknowledged", (a) => a === id2);
  if (c.pending.length) await waitFor(c, "acknowledged", (a) => a === id);
  assert.deepEqual(texts, [id, id, id2], "the first text went again with its id");
  const deadline = Date.now() + 10000;
  while (!(finals.includes("You said: survive the drop") && finals.includes("You said: sent while offline")) && Date.now() < deadline) {
    await waitFor(c, "message", (m) => m.final).catch((e) => {
      throw new Error(e.message + "; finals: " + finals.join("|") + "; sent texts: " + texts.join(",") + "; pending " + c.pending + "\n" + gw.log().slice(-3000));
    });
  }
  assert.ok(finals.includes("You said: survive the drop"), finals.join("|"));
  assert.ok(finals.includes("You said: sent while offline"), finals.join("|"));
  // One answer per id: after a ping round trip, and the answers so far, no copy.
  await c.ping();
  assert.equal(finals.filter((t) => t === "You said: survive the drop").length, 1, finals.join("|"));
});

/** A loopback port nothing listens on. */
async function closedPort() {
  const srv = createServer();
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

/** Settles with p, or rejects after ms: a connect() that never settles fails the test. */
function within(p, ms, what) {
  let timer;
  return Promise.race([p, new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not settled within ${ms} ms`)), ms)))]).finally(() => clearTimeout(timer));
}

test("an unreachable server or a bad URL: connect() rejects with connect_failed, an error event fires, no retry", async () => {
  for (const url of [`ws://127.0.0.1:${await closedPort()}/ws`, "not a url"]) {
    const c = newClient(uniq("ts-unreachable"), { url });
    const errors = [];
    c.on("error", (e) => errors.push(e));
    let connecting = 0;
    c.on("state", (s) => s === "connecting" && connecting++);
    await within(assert.rejects(c.connect(), (e) => e instanceof HermesError && e.code === "connect_failed" && e.local), 10000, url);
    assert.deepEqual(errors.map((e) => e.code), ["connect_failed"], url);
    assert.equal(c.state, "closed");
    const other = newClient(uniq("ts-other"));
    await other.connect();
    await other.ping();
    assert.equal(connecting, 1, "no reconnect after connect() failed: " + url);
  }
});

test("connect and ready timeouts: a server that never opens the socket, or never says ready, fails connect()", async () => {
  // A stalled server cannot be had from a real edge: a TCP listener that
  // never answers the upgrade, and a WebSocket server that never says ready.
  const tcp = createServer(() => {});
  await new Promise((r) => tcp.listen(0, "127.0.0.1", r));
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise((r) => wss.once("listening", r));
  try {
    const stalls = [
      [`ws://127.0.0.1:${tcp.address().port}/ws`, { connectTimeout: 300 }, /no connection within 300 ms/],
      [`ws://127.0.0.1:${wss.address().port}/ws`, { readyTimeout: 300 }, /no ready within 300 ms/],
    ];
    for (const [url, opts, why] of stalls) {
      const c = newClient(uniq("ts-stall"), { url, ...opts });
      const t0 = Date.now();
      await within(assert.rejects(c.connect(), (e) => e.code === "connect_failed" && why.test(e.message)), 10000, url);
      assert.ok(Date.now() - t0 >= 300, "not before the timeout");
    }
  } finally {
    tcp.close();
    wss.close();
  }
});

test("replaced by a newer connection of the device: disconnected 1000 without reconnect; a drop reconnects", async () => {
  const dev = uniq("ts-replaced");
  const a = newClient(dev);
  await a.connect();
  const gone = [];
  a.on("disconnected", (d) => gone.push(d));
  let connecting = 0;
  a.on("state", (s) => s === "connecting" && connecting++);
  const b = newClient(dev);
  const closed = waitFor(a, "disconnected");
  await b.connect();
  const d = await closed;
  assert.deepEqual(d, { code: 1000, reason: "replaced by a newer connection", reconnect: false });
  // Give a reconnect every chance to happen: b's pings round-trip, b stays.
  await b.ping();
  await b.ping();
  assert.equal(connecting, 0);
  assert.equal(a.state, "closed");
  assert.equal(b.state, "open");
  const dropped = waitFor(b, "disconnected");
  b.drop();
  assert.equal((await dropped).reconnect, true);
  await waitFor(b, "ready");
});

test("internal_error: resends with a growing pause, then gives up with the id", async () => {
  // A store of 1 MiB: every file over it gets internal_error, every time.
  const small = await startGateway({ MOBILE_MAX_BLOB_MIB: "1" });
  try {
    const c = new Client({ url: small.ws, token: small.token, device: { id: uniq("ts-resend-cap") }, WebSocket, minDelay: 40, maxDelay: 160, maxResends: 4 });
    clients.push(c);
    await c.connect();
    const at = [];
    c.on("sent", (f) => f.t === "media" && f.part === 0 && at.push(Date.now()));
    const id = c.sendFile(new Uint8Array(1536 * 1024), { kind: "document", filename: "big.bin", chunkBytes: 1024 * 1024 });
    const err = await waitFor(c, "error", (e) => e.id === id && /given up/.test(e.message));
    assert.equal(err.code, "internal_error");
    assert.equal(at.length, 5, "the first send and maxResends resends");
    assert.deepEqual(c.pending, []);
    const gaps = at.slice(1).map((t, i) => t - at[i]);
    // Each pause is drawn from [cap/2, cap], cap = min(maxDelay, minDelay·2^n): 40, 80, 160, 160.
    [20, 40, 80, 80].forEach((min, i) => assert.ok(gaps[i] >= min, `pause ${i} of ${gaps[i]} ms; at least ${min}: ${gaps}`));
  } finally {
    await small.stop();
  }
});

test("a reconnect storm: an upgrade refused with 503 waits at least its Retry-After, then connects once there is room", async () => {
  // One place in the hello phase, held by a socket that never says hello:
  // the edge sheds every other upgrade with 503 and Retry-After.
  const busy = await startGateway({ MOBILE_MAX_HELLO_CONNS: "1", MOBILE_MAX_HELLO_PER_ADDR: "1" });
  const blockers = [];
  const block = async () => {
    const b = new WebSocket(busy.ws);
    b.on("error", () => {});
    blockers.push(b);
    await new Promise((resolve, reject) => {
      b.once("open", resolve);
      b.once("close", () => reject(new Error("the blocking socket did not open")));
    });
  };
  const unblock = () => blockers.splice(0).forEach((b) => b.terminate());
  // Every attempt of the client, when it started and what the edge answered.
  const attempts = [];
  let attempted = () => {};
  class Traced extends WebSocket {
    constructor(url, ...rest) {
      super(url, ...rest);
      const a = { at: performance.now() };
      attempts.push(a);
      this.on("unexpected-response", (_req, res) => Object.assign(a, { status: res.statusCode, header: res.headers["retry-after"] }));
      attempted();
    }
  }
  const attemptsReach = (n) =>
    within(new Promise((resolve) => (attempted = () => attempts.length >= n && resolve()) && attempted()), 60000, `attempt ${n}`);
  const minDelay = 100;
  const maxDelay = 1000;
  const c = new Client({ url: busy.ws, token: busy.token, device: { id: uniq("ts-storm") }, WebSocket: Traced, minDelay, maxDelay, random: () => 0.5 });
  clients.push(c);
  const retries = [];
  const retryAt = new Map();
  c.on("retry", (r) => retries.push(r) && retryAt.set(r, performance.now()));
  /** The refused attempt before retry r, checked against the header the edge sent; then the gap to the next attempt. */
  const checkRefusal = async (r) => {
    const refused = attempts[attempts.length - 1];
    assert.equal(refused.status, 503);
    assert.match(refused.header ?? "", /^\d+$/, "Retry-After in seconds");
    const ra = Number(refused.header) * 1000;
    assert.ok(ra >= 1000);
    assert.equal(r.status, 503);
    assert.equal(r.retryAfter, ra);
    assert.equal(r.delay, Math.min(300000, ra + 0.5 * Math.min(maxDelay, minDelay * 2 ** r.attempt)), JSON.stringify(r));
    const n = attempts.length;
    await attemptsReach(n + 1);
    const gap = attempts[n].at - retryAt.get(r);
    assert.ok(gap >= ra, `the next attempt came ${gap} ms after a 503 with Retry-After ${refused.header}`);
    return r;
  };
  try {
    await block();
    const ready = c.connect();
    ready.catch(() => {}); // awaited below; a failure before then is the test's own
    // The first connection is refused: connect() waits and tries again rather than failing.
    const first = await checkRefusal(await waitFor(c, "retry", (r) => r.status === 503));
    unblock();
    assert.equal((await within(ready, 60000, "connect()")).t, "ready");
    assert.equal(c.state, "open");
    // Up only a moment: a drop reconnects into a full hello phase again, and the count of attempts goes on.
    await block();
    const from = retries.length;
    c.drop();
    const again = await checkRefusal(await waitFor(c, "retry", (r) => r.status === 503));
    const counts = retries.slice(from).map((r) => r.attempt);
    assert.ok(counts[0] > first.attempt && again.attempt > counts[0], "attempts " + retries.map((r) => r.attempt));
    unblock();
    await waitFor(c, "ready");
    assert.equal(c.state, "open");
  } finally {
    unblock();
    c.close();
    await busy.stop();
  }
});

test("card answers and deliveries made offline go after the reconnect", async () => {
  const c = newClient(uniq("ts-offline-answer"));
  await c.connect();
  c.sendText("/approve uptime");
  const card = await waitFor(c, "prompt");
  const target = newClient(uniq("ts-offline-target"));
  await target.connect();
  c.drop();
  assert.notEqual(c.state, "open");
  const done = waitFor(c, "promptDone", (d) => d.id === card.id);
  c.answer(card.id, "deny");
  const reminder = waitFor(target, "message", (m) => m.final);
  const id = c.deliver({ target: target.opts.device.id, text: "made offline" });
  assert.equal((await done).option_id, "deny");
  assert.equal((await reminder).text, "made offline");
  assert.ok(id);
});

test("an error names the frame it answers when one is unconfirmed", async () => {
  const c = newClient(uniq("ts-error-id"));
  await c.connect();
  const id = c.deliver({ target: uniq("nobody-here"), text: "to no one" });
  const err = await waitFor(c, "error");
  assert.equal(err.code, "device_offline");
  assert.equal(err.id, id);
});

test("a file whose last part comes without the earlier ones is refused, not handed over truncated", async () => {
  // A real edge never sends this: a WebSocket server that does.
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise((r) => wss.once("listening", r));
  wss.on("connection", (ws) => {
    ws.once("message", () => {
      ws.send(JSON.stringify({ t: "ready", v: 1, session: "mobile:x", device: { id: "x" }, capabilities: {} }));
      ws.send(JSON.stringify({ t: "media", id: "half", kind: "document", mime: "text/plain", filename: "a.txt", size: 8, part: 1, parts: 2, final: true, data: "YWJjZA==" }));
      ws.send(JSON.stringify({ t: "media", id: "whole", kind: "document", mime: "text/plain", filename: "b.txt", size: 4, data: "YWJjZA==" }));
    });
  });
  try {
    const c = newClient(uniq("ts-truncated"), { url: `ws://127.0.0.1:${wss.address().port}/ws` });
    const files = [];
    c.on("media", (f) => files.push(f.id));
    const acks = [];
    c.on("sent", (f) => f.t === "ack" && acks.push(f.id));
    const err = waitFor(c, "error");
    const whole = waitFor(c, "media", (f) => f.id === "whole");
    await c.connect();
    assert.equal((await err).id, "half");
    await whole;
    assert.deepEqual(files, ["whole"]);
    assert.deepEqual(acks, ["whole"]);
    c.close();
  } finally {
    wss.close();
  }
});

test("once and off; events() as an async iterator, ended by its signal", async () => {
  const c = newClient(uniq("ts-api"));
  await c.connect();
  const onceSeen = [];
  c.once("message", (m) => onceSeen.push(m.text));
  const all = [];
  const fn = (m) => all.push(m.text);
  c.on("message", fn);
  c.off("message", fn);
  const stop = new AbortController();
  const it = c.events(["message", "acknowledged"], { signal: stop.signal });
  const id = c.sendText("iterate");
  const got = [];
  let final = false;
  for await (const ev of it) {
    got.push(ev.type);
    if (ev.type === "message" && ev.value.final) final = true;
    // The ack and the answer travel separately: either may come first.
    if (final && got.includes("acknowledged")) stop.abort();
  }
  assert.deepEqual(onceSeen, ["You said: "], "once: the first version only");
  assert.deepEqual(all, [], "off: no calls");
  assert.ok(got.includes("acknowledged") && got.filter((t) => t === "message").length === 3, got.join(","));
  assert.equal(c.pending.includes(id), false);
  // A closed client ends its iterators.
  const rest = c.events();
  c.close();
  assert.deepEqual(await rest.next(), { value: undefined, done: true });
});

test("getToken is asked before each connection; a logger hears a handler's error", async () => {
  const logs = [];
  let asked = 0;
  const c = newClient(uniq("ts-token"), {
    token: "stale",
    getToken: async () => (asked++, gw.token),
    logger: (level, msg) => logs.push([level, msg]),
  });
  c.on("ready", () => {
    throw new Error("a broken handler");
  });
  await c.connect();
  assert.equal(asked, 1);
  assert.ok(logs.some(([l, m]) => l === "error" && /ready handler threw/.test(m)), JSON.stringify(logs));
  const back = waitFor(c, "ready");
  c.drop();
  await back;
  assert.equal(asked, 2, "a fresh token for the reconnect");
  assert.ok(logs.some(([l, m]) => l === "warn" && /socket closed/.test(m)), JSON.stringify(logs));
});

test("connect() is cancelled by its AbortSignal", async () => {
  const tcp = createServer(() => {});
  await new Promise((r) => tcp.listen(0, "127.0.0.1", r));
  try {
    const c = newClient(uniq("ts-cancel"), { url: `ws://127.0.0.1:${tcp.address().port}/ws` });
    const ac = new AbortController();
    const p = c.connect({ signal: ac.signal });
    ac.abort();
    await within(assert.rejects(p, (e) => e.code === "cancelled"), 5000, "cancelled connect");
    assert.equal(c.state, "closed");
    const pre = new AbortController();
    pre.abort();
    await assert.rejects(newClient(uniq("ts-cancel2")).connect({ signal: pre.signal }), (e) => e.code === "cancelled");
  } finally {
    tcp.close();
  }
});

test("a wrong token: auth_failed, typed, and no reconnect", async () => {
  const c = newClient(uniq("ts-auth"), { token: "wrong" });
  let connecting = 0;
  c.on("state", (s) => s === "connecting" && connecting++);
  await assert.rejects(c.connect(), (e) => e instanceof HermesError && e.code === "auth_failed" && e.permanent);
  // Give a reconnect every chance: a ping of another client round-trips meanwhile.
  const other = newClient(uniq("ts-other"));
  await other.connect();
  await other.ping();
  await other.ping();
  assert.equal(connecting, 1);
  assert.notEqual(c.state, "open");
});

test("push: the app registers its own FCM or APNs token and takes it back; refusals are typed", async () => {
  const pushGw = await startGateway(pushEnv());
  try {
    const c = new Client({ url: pushGw.ws, token: pushGw.token, device: { id: uniq("ts-push") }, WebSocket });
    clients.push(c);
    const ready = await c.connect();
    assert.deepEqual(ready.capabilities.push, ["fcm", "apns"]);
    const answers = [];
    c.on("push", (p) => answers.push(p));
    const sent = [];
    c.on("sent", (f) => f.t === "push" && sent.push(f));
    await c.registerPush("fcm", "dGVzdA:APA91bH-test_token.1");
    await c.registerPush("apns", "0a1b2c3d4e5f");
    await c.removePush("apns");
    assert.deepEqual(answers, [
      { kind: "fcm", registered: true },
      { kind: "apns", registered: true },
      { kind: "apns", registered: false },
    ]);
    assert.deepEqual(sent[2], { t: "push", kind: "apns", token: "" });
    // The gateway's refusal: not hex, as an APNs device token is.
    await assert.rejects(c.registerPush("apns", "not-hex"), (e) => e instanceof HermesError && e.code === "bad_frame" && !e.local && /hex/.test(e.message));
    // Refused before sending: no token can hold a space.
    await assert.rejects(c.registerPush("fcm", "a b"), (e) => e.code === "bad_frame" && e.local);
    // Registrations go on after a refusal.
    await c.registerPush("fcm", "dGVzdA:APA91bH-test_token.2");
    assert.equal(sent.length, 5);
  } finally {
    await pushGw.stop();
  }
  // A gateway without FCM or APNs offers none: refused locally, nothing sent.
  const plain = newClient(uniq("ts-nopush"));
  const ready = await plain.connect();
  assert.equal(ready.capabilities.push, undefined);
  let wrote = false;
  plain.on("sent", (f) => f.t === "push" && (wrote = true));
  await assert.rejects(plain.registerPush("fcm", "tok"), (e) => e.code === "unsupported_frame" && e.local);
  assert.equal(wrote, false);
});

test("an owner's app key of the tenants file is taken as the token; a wrong secret is auth_failed", async () => {
  const dir = mkdtempSync(join(tmpdir(), "hermes-tenants-"));
  const file = join(dir, "tenants.yaml");
  writeFileSync(file, "tenants:\n  - id: acme\n    keys:\n      - {id: app, kind: app, secret: acme-app-secret}\n");
  const owners = await startGateway({ MOBILE_TENANTS_FILE: file });
  try {
    const key = "hmt_acme.app.acme-app-secret"; // hmt_<owner>.<key id>.<secret>
    const dev = uniq("ts-owner");
    const c = new Client({ url: owners.ws, token: key, device: { id: dev }, WebSocket });
    clients.push(c);
    const ready = await c.connect();
    // A device of its owner, named by its plain id.
    assert.equal(ready.session, "mobile:" + dev);
    assert.equal(ready.device.id, dev);
    const answer = waitFor(c, "message", (m) => m.final);
    c.sendText("hello from acme");
    assert.equal((await answer).text, "You said: hello from acme");
    const wrong = new Client({ url: owners.ws, token: "hmt_acme.app.wrong", device: { id: uniq("ts-owner") }, WebSocket });
    clients.push(wrong);
    await assert.rejects(wrong.connect(), (e) => e instanceof HermesError && e.code === "auth_failed" && e.permanent);
  } finally {
    await owners.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a device bound to another token: forbidden stops the client", async () => {
  clients.forEach((c) => c.close());
  await gw.stop();
  gw = await startGateway({ MOBILE_EXTRA_TOKENS: "bound-dev=bound-token" });
  const c = newClient("bound-dev"); // the app token, not the device's
  await assert.rejects(c.connect(), (e) => e instanceof HermesError && (e.code === "forbidden" || e.code === "auth_failed"));
  const ok = newClient("bound-dev", { token: "bound-token" });
  await ok.connect();
});
