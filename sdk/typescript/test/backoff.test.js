// The reconnect backoff without a network: the computation (full jitter,
// Retry-After as a floor, the cap, Retry-After parsing), and the client's
// use of it against scripted WebSockets, with the random source, the sleep
// and the clock injected, so every pause is known exactly.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, MAX_RETRY_AFTER, backoffWindow, fullJitter, parseRetryAfter, retryDelay } from "../dist/esm/index.js";

/** A seedable random source in [0, 1) (mulberry32). */
function seeded(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const BASE = 500;
const CAP = 30000;

test("full jitter: at attempt n the pause is in [0, min(cap, base·2^n)], both ends reached", () => {
  const almostOne = () => 1 - 2 ** -40;
  for (let n = 0; n <= 12; n++) {
    const window = Math.min(CAP, BASE * 2 ** n);
    assert.equal(backoffWindow(n, BASE, CAP), window, `window at attempt ${n}`);
    assert.equal(fullJitter(n, BASE, CAP, () => 0), 0, `min at attempt ${n}`);
    assert.ok(window - fullJitter(n, BASE, CAP, almostOne) < 1e-6, `max at attempt ${n}`);
    const rnd = seeded(n + 1);
    let lo = Infinity;
    let hi = 0;
    for (let i = 0; i < 2000; i++) {
      const d = fullJitter(n, BASE, CAP, rnd);
      assert.ok(d >= 0 && d < window, `attempt ${n}: ${d} outside [0, ${window})`);
      lo = Math.min(lo, d);
      hi = Math.max(hi, d);
    }
    // Spread over the whole window, not bunched at one end.
    assert.ok(lo < window * 0.01 && hi > window * 0.99, `attempt ${n}: drawn from ${lo} to ${hi} of ${window}`);
  }
  assert.equal(backoffWindow(2000, BASE, CAP), CAP, "a huge attempt count stays at the cap");
  assert.equal(backoffWindow(-1, BASE, CAP), BASE);
  assert.equal(backoffWindow(3, 0, CAP), 0);
});

test("a random source outside [0, 1) cannot push a pause out of its window", () => {
  assert.equal(fullJitter(0, BASE, CAP, () => -3), 0);
  assert.equal(fullJitter(0, BASE, CAP, () => 7), BASE);
  assert.equal(fullJitter(0, BASE, CAP, () => NaN), 0);
});

test("Retry-After is a floor: the pause is Retry-After plus the attempt's full jitter, at most the cap of 5 minutes", () => {
  for (let n = 0; n <= 10; n++) {
    const window = Math.min(CAP, BASE * 2 ** n);
    for (const ra of [0, 1000, 5000, 30000]) {
      assert.equal(retryDelay({ attempt: n, base: BASE, cap: CAP, floor: ra }, () => 0), ra);
      assert.equal(retryDelay({ attempt: n, base: BASE, cap: CAP, floor: ra }, () => 0.5), ra + window / 2);
      const rnd = seeded(100 + n);
      for (let i = 0; i < 500; i++) {
        const d = retryDelay({ attempt: n, base: BASE, cap: CAP, floor: ra }, rnd);
        assert.ok(d >= ra && d < ra + window, `attempt ${n}, Retry-After ${ra}: ${d}`);
      }
    }
  }
  // Without a floor: plain full jitter.
  assert.equal(retryDelay({ attempt: 3, base: BASE, cap: CAP }, () => 0.25), 1000);
  // The cap: a Retry-After of an hour waits 5 minutes; so does one of 299 s plus jitter.
  assert.equal(MAX_RETRY_AFTER, 300000);
  assert.equal(retryDelay({ attempt: 0, base: BASE, cap: CAP, floor: 3600000 }, () => 0.9), MAX_RETRY_AFTER);
  assert.equal(retryDelay({ attempt: 8, base: BASE, cap: CAP, floor: 299000 }, () => 0.9), MAX_RETRY_AFTER);
  assert.equal(retryDelay({ attempt: 8, base: BASE, cap: CAP, floor: 60000, max: 45000 }, () => 0.9), 45000);
});

test("Retry-After: delay-seconds and HTTP-dates parse; garbage is ignored", () => {
  const now = Date.UTC(1994, 10, 6, 8, 49, 30); // 7 s before the RFC's example date
  assert.equal(parseRetryAfter("5", now), 5000);
  assert.equal(parseRetryAfter(" 30 ", now), 30000);
  assert.equal(parseRetryAfter("0", now), 0);
  assert.equal(parseRetryAfter(["2", "9"], now), 2000, "the first of repeated headers");
  assert.equal(parseRetryAfter("9".repeat(400), now), Infinity, "past a double: very long, which the cap bounds");
  assert.equal(retryDelay({ attempt: 0, base: BASE, cap: CAP, floor: parseRetryAfter("9".repeat(400), now) }, () => 0.5), MAX_RETRY_AFTER);
  // RFC 9110's three forms of one instant.
  assert.equal(parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", now), 7000);
  assert.equal(parseRetryAfter("Sunday, 06-Nov-94 08:49:37 GMT", now), 7000);
  assert.equal(parseRetryAfter("Sun Nov  6 08:49:37 1994", now), 7000);
  assert.equal(parseRetryAfter("sun, 06 nov 1994 08:49:37 gmt", now), 7000, "case does not matter");
  assert.equal(parseRetryAfter("Sun, 06 Nov 1994 08:49:00 GMT", now), 0, "a date already past: no wait");
  for (const bad of [undefined, null, "", "   ", "soon", "-1", "1.5", "5s", "+5", "0x10", "1e3", "5, 6",
    "Sun, 06 Nov 1994 08:49:37 PST", "Sun, 06 Foo 1994 08:49:37 GMT", "Sun, 06 Nov 1994 25:49:37 GMT", "Sun, 6 Nov 1994 08:49:37 GMT"]) {
    assert.equal(parseRetryAfter(bad, now), undefined, JSON.stringify(bad));
  }
});

// Scripted WebSockets: each new socket takes the next step of the script.
// "refuse" answers the upgrade with an HTTP status, "accept" opens and says
// ready to hello, "fatal" answers hello with a fatal error frame and
// closes with 1008 and the code as reason.

function fakeSockets(script, { seesStatus }) {
  const sockets = [];
  class Fake {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.listeners = {};
      sockets.push(this);
      const step = script.shift() ?? { refuse: 503, headers: { "retry-after": "1" } };
      queueMicrotask(() => this.run(step));
    }
    run(step) {
      if (step.refuse) {
        if (seesStatus) {
          // As the ws package does: the HTTP answer to a listener, which ends the socket.
          for (const fn of this.listeners["unexpected-response"] ?? []) fn({}, { statusCode: step.refuse, headers: step.headers ?? {}, resume() {} });
        } else {
          this.end(1006);
        }
        return;
      }
      this.fatal = step.fatal;
      this.readyState = 1;
      this.onopen?.();
    }
    send(data) {
      const f = JSON.parse(data);
      if (f.t === "hello" && this.fatal) {
        // As the edge refuses a hello: an error frame, then close 1008 with the code.
        queueMicrotask(() => this.onmessage?.({ data: JSON.stringify({ t: "error", code: this.fatal, message: "no", fatal: true }) }));
        this.end(1008, this.fatal);
      } else if (f.t === "hello") {
        const ready = { t: "ready", v: 1, session: "mobile:" + f.device.id, device: { id: f.device.id, name: "" }, avatar_url: "", capabilities: {} };
        queueMicrotask(() => this.onmessage?.({ data: JSON.stringify(ready) }));
      }
      if (f.t === "ping") queueMicrotask(() => this.onmessage?.({ data: JSON.stringify({ t: "pong", ts: f.ts }) }));
    }
    end(code, reason = "") {
      if (this.readyState === 3) return;
      this.readyState = 3;
      // As a browser and the ws package do: error and close come later, not inside close().
      queueMicrotask(() => {
        this.onerror?.({});
        this.onclose?.({ code, reason });
      });
    }
    close(code = 1000) {
      this.end(code);
    }
  }
  if (seesStatus) {
    Fake.prototype.on = function (ev, fn) {
      (this.listeners[ev] ??= []).push(fn);
    };
    Fake.prototype.terminate = function () {
      this.end(1006);
    };
  }
  return { Fake, sockets };
}

/** An injected sleep that records each pause and ends it when the test says. */
function manualSleep() {
  const pauses = [];
  let wake = null;
  const sleep = (ms, signal) =>
    new Promise((resolve) => {
      pauses.push({ ms, resolve });
      signal.addEventListener("abort", resolve, { once: true });
      wake?.();
    });
  /** The next pause once the client takes it. */
  const next = async () => {
    while (pauses.length === 0) await new Promise((r) => (wake = r));
    wake = null;
    return pauses.shift();
  };
  return { sleep, next };
}

function fakeClient(script, opts = {}) {
  const { Fake, sockets } = fakeSockets(script, { seesStatus: opts.seesStatus ?? true });
  const { sleep, next } = manualSleep();
  const clock = { t: 0 };
  const c = new Client({
    url: "ws://edge.test/ws",
    token: "t",
    device: { id: "dev" },
    WebSocket: Fake,
    pingInterval: 0,
    random: () => 0.5,
    sleep,
    now: () => clock.t,
    logger: () => {},
    ...opts,
  });
  const retries = [];
  c.on("retry", (r) => retries.push(r));
  return { c, sockets, next, clock, retries };
}

test("the client: 503 with Retry-After waits Retry-After plus jitter, the attempt count grows, connect() resolves at ready", async () => {
  const refused = (ra) => ({ refuse: 503, headers: { "retry-after": ra } });
  const { c, sockets, next, retries } = fakeClient([refused("5"), refused("2"), { refuse: 429, headers: { "retry-after": "3" } }, { refuse: 503 }, refused("soon"), {}]);
  const ready = c.connect();
  const want = [
    [5000 + 0.5 * 500, 503, 5000],
    [2000 + 0.5 * 1000, 503, 2000],
    [3000 + 0.5 * 2000, 429, 3000],
    [0.5 * 4000, 503, undefined], // no Retry-After: full jitter
    [0.5 * 8000, 503, undefined], // an unreadable one: ignored
  ];
  for (const [i, [ms, status, ra]] of want.entries()) {
    const p = await next();
    assert.equal(p.ms, ms, `pause ${i}`);
    assert.equal(retries[i].attempt, i);
    assert.equal(retries[i].status, status);
    assert.equal(retries[i].retryAfter, ra);
    assert.equal(sockets.length, i + 1, "no attempt before the pause ends");
    p.resolve();
  }
  const r = await ready;
  assert.equal(r.t, "ready");
  assert.equal(c.state, "open");
  assert.equal(sockets.length, want.length + 1);
  c.close();
});

test("the client: a Retry-After past the cap waits the cap", async () => {
  const { c, next } = fakeClient([{ refuse: 503, headers: { "retry-after": "86400" } }, {}], { maxRetryAfter: 120000 });
  const ready = c.connect();
  const p = await next();
  assert.equal(p.ms, 120000);
  p.resolve();
  await ready;
  c.close();
});

test("the client: without the HTTP status (a browser), a failed attempt waits at least the assumed Retry-After of 1 s", async () => {
  const { c, next, retries, clock } = fakeClient([{}, { refuse: 503 }, { refuse: 503 }, {}], { seesStatus: false });
  await c.connect();
  clock.t = 60000; // up long enough: the backoff starts again
  c.drop();
  // The drop of an open socket: plain full jitter.
  let p = await next();
  assert.equal(p.ms, 0.5 * 500);
  assert.deepEqual(retries[0], { attempt: 0, delay: 250, reason: "connection lost" });
  p.resolve();
  // Attempts that failed before the socket opened: 1 s plus full jitter.
  p = await next();
  assert.equal(p.ms, 1000 + 0.5 * 1000);
  assert.equal(retries[1].retryAfter, 1000);
  assert.equal(retries[1].status, undefined);
  p.resolve();
  p = await next();
  assert.equal(p.ms, 1000 + 0.5 * 2000);
  p.resolve();
  await new Promise((r) => c.once("ready", r));
  c.close();
});

test("the client: the backoff starts again only after a connection stayed ready for stableAfter", async () => {
  const { c, next, retries, clock } = fakeClient([{}, {}, {}, {}], { stableAfter: 10000 });
  await c.connect();
  const dropAfter = async (upFor) => {
    clock.t += upFor;
    c.drop();
    const p = await next();
    p.resolve();
    await new Promise((r) => c.once("ready", r));
  };
  await dropAfter(1000); // a short-lived connection: the count goes on
  await dropAfter(1000);
  await dropAfter(10000); // up 10 s: starts again
  assert.deepEqual(retries.map((r) => r.attempt), [0, 1, 0]);
  c.close();
});

test("the client: auth_failed and forbidden still stop it, without a pause; a 503 on the first connect does not", async () => {
  for (const code of ["auth_failed", "forbidden"]) {
    const { c, retries } = fakeClient([{ fatal: code }]);
    await assert.rejects(c.connect(), (e) => e.code === code && e.fatal);
    assert.deepEqual(retries, []);
    assert.equal(c.state, "closed");
  }
  // Other refusals on the first connect still fail it: nothing to wait for.
  const { c, retries } = fakeClient([{ refuse: 404 }]);
  await assert.rejects(c.connect(), (e) => e.code === "connect_failed" && /HTTP 404/.test(e.message));
  assert.deepEqual(retries, []);
  // Without reconnecting, a 503 fails connect() too.
  const once = fakeClient([{ refuse: 503, headers: { "retry-after": "1" } }], { reconnect: false });
  await assert.rejects(once.c.connect(), (e) => e.code === "connect_failed" && /HTTP 503, Retry-After 1 s/.test(e.message));
});

test("the client: close() during a pause ends it, and no attempt follows", async () => {
  const { c, sockets, next } = fakeClient([{ refuse: 503, headers: { "retry-after": "30" } }]);
  const ready = c.connect();
  const p = await next();
  assert.equal(p.ms, 30000 + 250);
  c.close();
  await assert.rejects(ready);
  p.resolve();
  await new Promise((r) => setImmediate(r));
  assert.equal(sockets.length, 1);
  assert.equal(c.state, "closed");
});
