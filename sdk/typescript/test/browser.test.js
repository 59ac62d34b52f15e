// The browser client and the avatar page in headless Chromium (Debian's
// chromium, driven by puppeteer-core), against a real gateway. Screenshots
// go to test-artifacts/browser/ at the repository root (or
// $HERMES_ARTIFACTS).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createServer as createHTTPServer } from "node:http";
import { createServer as createTCPServer } from "node:net";
import { WebSocket as NodeWebSocket } from "ws";
import { startGateway } from "./gateway.js";

const chromium = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const missing = !existsSync(chromium);
if (missing && process.env.CI === "true") throw new Error(`${chromium} is missing; CI installs it (apt-get install chromium)`);
const skip = missing ? `${chromium} is missing: apt-get install chromium to run the browser tests` : false;

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const artifacts = process.env.HERMES_ARTIFACTS || join(repo, "test-artifacts", "browser");

let gw, browser, profile;
const external = [];
let mediaServer, mediaOrigin; // another origin, as the agent's media links are

// A 1×1 PNG.
const png = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", "base64");

before(async () => {
  if (skip) return;
  mkdirSync(artifacts, { recursive: true });
  gw = await startGateway();
  mediaServer = createHTTPServer((req, res) => {
    res.writeHead(200, { "Content-Type": "image/png", "Content-Length": png.length });
    res.end(png);
  });
  await new Promise((r) => mediaServer.listen(0, "127.0.0.1", r));
  mediaOrigin = `http://127.0.0.1:${mediaServer.address().port}`;
  const puppeteer = (await import("puppeteer-core")).default;
  profile = mkdtempSync(join(tmpdir(), "hermes-chromium-"));
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-dev-shm-usage",
      `--user-data-dir=${profile}`,
    ],
  });
});

after(async () => {
  await browser?.close();
  await gw?.stop();
  mediaServer?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

async function newPage() {
  const page = await browser.newPage();
  await page.setViewport({ width: 800, height: 900 });
  page.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith(gw.http) && !u.startsWith(gw.ws) && !u.startsWith(mediaOrigin) && !/^(data|blob|about):/.test(u)) external.push(u);
  });
  page.on("pageerror", (e) => console.error("page error:", e.message));
  return page;
}

async function logIn(page, name) {
  await page.goto(gw.http + "/");
  await page.type("#token", gw.token);
  await page.type("#device", name);
  await page.click("#connect");
  await page.waitForSelector("#chat:not([hidden])");
  await page.waitForSelector("body[data-state=open]");
}

/** Counts the client's passes through "connecting" from now on. */
async function countReconnects(page) {
  await page.evaluate(() => {
    window.__connecting = 0;
    window.hermes.on("state", (s) => s === "connecting" && window.__connecting++);
  });
  return () => page.evaluate(() => window.__connecting);
}

const agentTexts = (page) => page.$$eval(".msg.agent", (els) => els.map((e) => e.textContent));

test("the browser client: log in, a streamed answer, a card, a file over one part", { skip, timeout: 120000 }, async () => {
  const page = await newPage();
  await page.goto(gw.http + "/");
  await page.type("#token", gw.token);
  await page.type("#device", "Headless");
  await page.click("#connect");
  await page.waitForSelector("#chat:not([hidden])");
  await page.waitForSelector("body[data-state=open]");

  // Every version of the agent's bubbles, to see the answer grow.
  await page.evaluate(() => {
    window.__seen = [];
    window.__avatar = [];
    new MutationObserver(() => {
      for (const el of document.querySelectorAll(".msg.agent")) {
        const t = el.textContent;
        if (window.__seen[window.__seen.length - 1] !== t) window.__seen.push(t);
      }
      const a = document.body.dataset.avatar;
      if (a && window.__avatar[window.__avatar.length - 1] !== a) window.__avatar.push(a);
    }).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
    window.__announced = [];
    const a = document.getElementById("announce");
    new MutationObserver(() => window.__announced.push(a.textContent)).observe(a, { subtree: true, childList: true, characterData: true });
  });
  assert.equal(await page.$eval("#messages", (e) => e.getAttribute("aria-live")), null, "the streaming bubbles are not a live region");
  assert.equal(await page.$eval("#status", (e) => e.textContent), "connected");
  // An empty conversation says what the demo agent's commands are.
  const hint = await page.$eval("#hint", (e) => ({ shown: getComputedStyle(e).display !== "none", text: e.textContent }));
  assert.ok(hint.shown, "the hint shows while the conversation is empty");
  for (const cmd of ["/approve", "/confirm", "/clarify"]) assert.ok(hint.text.includes(cmd), `the hint names ${cmd}: ${hint.text}`);
  // The page's icon is served with it.
  const icon = await page.$eval("link[rel=icon]", (e) => e.href);
  const res = await fetch(icon);
  assert.equal(res.status, 200, icon);
  assert.equal(res.headers.get("content-type"), "image/svg+xml");
  await page.type("#text", "hello from the browser");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.agent.final")].some((e) => e.textContent === "You said: hello from the browser"));
  const seen = await page.evaluate(() => window.__seen);
  assert.equal(seen[0], "You said: ", "the answer starts with its first part: " + JSON.stringify(seen));
  assert.ok(seen.some((t) => t.length > "You said: ".length && t.length < "You said: hello from the browser".length), "a growing edit came in between: " + JSON.stringify(seen));
  await page.waitForSelector(".msg.me.sent"); // the gateway took the text
  assert.equal(await page.$eval(".msg.me.sent .state", (e) => e.textContent), "✓ sent");
  assert.deepEqual(await page.evaluate(() => window.__announced), ["You said: hello from the browser"], "the answer is announced once, final, not each edit");
  assert.equal(await page.$eval(".msg.agent.final", (e) => e.getAttribute("aria-busy")), "false");
  assert.equal(await page.$eval("#hint", (e) => getComputedStyle(e).display), "none", "the hint goes once there are messages");

  // Written while the network is down: pending, and it looks it, until the gateway takes it.
  // In one task, so the reconnect cannot come in between.
  const pending = await page.evaluate(() => {
    window.hermes.drop();
    document.getElementById("text").value = "while offline";
    document.getElementById("composer").requestSubmit();
    const e = [...document.querySelectorAll(".msg.me")].pop();
    return { cls: e.className, opacity: getComputedStyle(e).opacity, border: getComputedStyle(e).borderStyle, state: e.querySelector(".state").textContent };
  });
  assert.match(pending.cls, /\bpending\b/);
  delete pending.cls;
  const sent = await page.$eval(".msg.me.sent", (e) => ({ opacity: getComputedStyle(e).opacity, border: getComputedStyle(e).borderStyle }));
  assert.equal(pending.state, "sending…");
  assert.notDeepEqual({ opacity: pending.opacity, border: pending.border }, sent, "pending and sent look different");
  await page.waitForFunction(() => document.querySelectorAll(".msg.me.pending").length === 0 && document.querySelectorAll(".msg.me.sent").length === 2);
  const avatars = await page.evaluate(() => window.__avatar);
  assert.ok(avatars.includes("thinking"), "the avatar followed the agent: " + avatars);

  // A card, answered with its button.
  await page.type("#text", "/approve ls");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".card code");
  assert.equal(await page.$eval(".card code", (e) => e.textContent), "ls");
  await page.screenshot({ path: join(artifacts, "chat-card.png") });
  await page.click('.card button[data-option="once"]');
  await page.waitForSelector(".card.closed .done");
  assert.equal(await page.$eval(".card .done", (e) => e.textContent), "answered: once");
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.agent.final")].some((e) => e.textContent === "exec_approval resolved: once"));

  // A file of 3 MiB and a bit: two parts up, echoed back whole.
  const dir = mkdtempSync(join(tmpdir(), "hermes-upload-"));
  const size = 3 * 1024 * 1024 + 4096;
  const bytes = Buffer.alloc(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 7) & 0xff;
  const file = join(dir, "report.bin");
  writeFileSync(file, bytes);
  const parts = [];
  await page.exposeFunction("__part", (p) => parts.push(p));
  await page.evaluate(() => window.hermes.on("sent", (f) => f.t === "media" && window.__part([f.part, f.parts])));
  const input = await page.$("#file");
  await input.uploadFile(file);
  await page.waitForSelector(".msg.me.file");
  await page.waitForFunction((n) => [...document.querySelectorAll(".msg.agent.media .meta")].some((e) => e.textContent.includes(`report.bin · ${n} bytes`)), { timeout: 60000 }, size);
  const echoed = await page.evaluate(async () => {
    const a = document.querySelector(".msg.agent.media a");
    const b = new Uint8Array(await (await fetch(a.href)).arrayBuffer());
    let sum = 0;
    for (let i = 0; i < b.length; i++) sum = (sum + b[i] * (i % 251)) % 1000000007;
    return { length: b.length, sum };
  });
  let sum = 0;
  for (let i = 0; i < size; i++) sum = (sum + bytes[i] * (i % 251)) % 1000000007;
  assert.deepEqual(echoed, { length: size, sum }, "the file came back byte for byte");
  assert.deepEqual(parts, [[0, 2], [1, 2]]);
  rmSync(dir, { recursive: true, force: true });

  await page.screenshot({ path: join(artifacts, "chat.png"), fullPage: true });
  assert.deepEqual(external, [], "no requests outside the gateway");
  await page.close();
});

test("the avatar page: three states by fragment and by postMessage; still under reduced motion", { skip, timeout: 60000 }, async () => {
  const page = await newPage();
  const mouth = () => page.$eval(".mouth", (e) => ({ h: e.getBoundingClientRect().height, anim: getComputedStyle(e).animationName }));
  const dims = {};
  for (const state of ["idle", "thinking", "speaking"]) {
    await page.goto(`${gw.http}/avatar/#state=${state}`);
    await page.waitForSelector(`html[data-state=${state}]`);
    assert.equal(await page.$eval(".label", (e) => e.textContent), state);
    await page.screenshot({ path: join(artifacts, `avatar-${state}.png`) });
    dims[state] = await mouth();
  }
  assert.equal(dims.speaking.anim, "talk");
  assert.equal(dims.thinking.anim, "none");

  // postMessage, as an embedding app sends it: an object or its JSON text.
  await page.goto(`${gw.http}/avatar/`);
  await page.waitForSelector("html[data-state=idle]");
  await page.evaluate(() => window.postMessage({ t: "avatar", state: "thinking" }, "*"));
  await page.waitForSelector("html[data-state=thinking]");
  await page.evaluate(() => window.postMessage(JSON.stringify({ t: "avatar", state: "speaking" }), "*"));
  await page.waitForSelector("html[data-state=speaking]");
  await page.evaluate(() => window.postMessage({ t: "avatar", state: "dancing" }, "*"));
  await page.waitForSelector("html[data-state=idle]");
  // The fragment changing later counts too.
  await page.evaluate(() => (location.hash = "#state=speaking"));
  await page.waitForSelector("html[data-state=speaking]");

  // Reduced motion: nothing animates, the states still differ in shape.
  await page.emulateMediaFeatures([{ name: "prefers-reduced-motion", value: "reduce" }]);
  assert.equal((await mouth()).anim, "none");
  assert.ok((await mouth()).h > dims.idle.h, "the open mouth still shows speaking");
  await page.screenshot({ path: join(artifacts, "avatar-speaking-reduced-motion.png") });
  assert.deepEqual(external, [], "no requests outside the gateway");
  await page.close();
});

test("a wrong server URL: a visible error on the login form", { skip, timeout: 60000 }, async () => {
  const tcp = createTCPServer();
  await new Promise((r) => tcp.listen(0, "127.0.0.1", r));
  const port = tcp.address().port;
  await new Promise((r) => tcp.close(r)); // nothing listens there now
  const page = await newPage();
  await page.goto(gw.http + "/");
  await page.type("#token", gw.token);
  await page.type("#device", "Wrong URL");
  await page.$eval("#server", (e, v) => (e.value = v), `ws://127.0.0.1:${port}/ws`);
  await page.click("#connect");
  await page.waitForFunction(() => document.getElementById("login-error").textContent !== "", { timeout: 20000 });
  const err = await page.$eval("#login-error", (e) => ({ text: e.textContent, visible: e.getBoundingClientRect().height > 0 && getComputedStyle(e).visibility !== "hidden" }));
  assert.match(err.text, new RegExp(`Cannot connect to ws://127.0.0.1:${port}/ws`));
  assert.ok(err.visible, "the error is shown");
  assert.equal(await page.$eval("#chat", (e) => e.hidden), true);
  await page.screenshot({ path: join(artifacts, "login-wrong-url.png") });
  await page.close();
});

test("a reconnect storm: the browser cannot see the 503, so a refused attempt waits at least the assumed Retry-After of 1 s", { skip, timeout: 120000 }, async () => {
  // An edge with one place in the hello phase, held by a socket from here
  // that never says hello: it refuses the page's upgrades with 503 and
  // Retry-After, which a browser's WebSocket reports only as a close 1006.
  const busy = await startGateway({ MOBILE_MAX_HELLO_CONNS: "1", MOBILE_MAX_HELLO_PER_ADDR: "1" });
  const blockers = [];
  const unblock = () => blockers.splice(0).forEach((b) => b.terminate());
  // Not newPage(): this page talks to a second edge on purpose.
  const page = await browser.newPage();
  page.on("pageerror", (e) => console.error("page error:", e.message));
  try {
    await page.goto(gw.http + "/");
    await page.type("#token", busy.token);
    await page.type("#device", "Storm");
    await page.$eval("#server", (e, v) => (e.value = v), busy.ws);
    await page.click("#connect");
    await page.waitForSelector("body[data-state=open]");
    // From now on, each attempt of the client (when it started, whether it
    // opened, when it closed) and each pause it takes before the next.
    await page.evaluate(() => {
      const Native = window.WebSocket;
      window.__attempts = [];
      window.__retries = [];
      window.WebSocket = class extends Native {
        constructor(...args) {
          super(...args);
          const a = { at: performance.now(), opened: false, closed: 0 };
          window.__attempts.push(a);
          this.addEventListener("open", () => (a.opened = true));
          this.addEventListener("close", () => (a.closed = performance.now()));
        }
      };
      window.hermes.on("retry", (r) => window.__retries.push({ ...r, at: performance.now() }));
    });
    const b = new NodeWebSocket(busy.ws);
    b.on("error", () => {});
    blockers.push(b);
    await new Promise((resolve, reject) => {
      b.once("open", resolve);
      b.once("close", () => reject(new Error("the blocking socket did not open")));
    });
    await page.evaluate(() => window.hermes.drop());
    // A refused attempt (closed without opening) and the attempt after it.
    await page.waitForFunction(() => {
      const a = window.__attempts;
      const i = a.findIndex((x) => x.closed && !x.opened);
      return i >= 0 && a.length > i + 1;
    }, { timeout: 60000 });
    const { attempts, retries } = await page.evaluate(() => ({ attempts: window.__attempts, retries: window.__retries }));
    const i = attempts.findIndex((x) => x.closed && !x.opened);
    const [refused, next] = [attempts[i], attempts[i + 1]];
    const r = retries.find((r) => r.at >= refused.closed);
    assert.ok(r, "a pause after the refused attempt: " + JSON.stringify(retries));
    assert.equal(r.status, undefined, "a browser does not see the status");
    assert.equal(r.retryAfter, 1000);
    assert.ok(r.delay >= 1000 && r.delay <= 1000 + Math.min(30000, 500 * 2 ** r.attempt), JSON.stringify(r));
    const gap = next.at - refused.closed;
    assert.ok(gap >= 1000, `the next attempt came ${gap} ms after the refused one closed`);
    // Room again: the client gets in.
    unblock();
    await page.waitForSelector("body[data-state=open]", { timeout: 60000 });
  } finally {
    unblock();
    await page.close();
    await busy.stop();
  }
});

test("two tabs: each its own device, both stay connected, no reconnect storm", { skip, timeout: 90000 }, async () => {
  const a = await newPage();
  await logIn(a, "Tab A");
  const b = await newPage();
  await logIn(b, "Tab B");
  const ids = await Promise.all([a, b].map((p) => p.evaluate(() => window.hermes.opts.device.id)));
  assert.notEqual(ids[0], ids[1], "each tab is its own device: " + ids);
  const reconnects = await Promise.all([a, b].map(countReconnects));
  for (const [p, t] of [[a, "from tab A"], [b, "from tab B"]]) {
    await p.bringToFront(); // input to a tab behind another may wait for it to come to the front
    await p.type("#text", t);
    await p.keyboard.press("Enter");
  }
  for (const [p, t] of [[a, "from tab A"], [b, "from tab B"]]) {
    await p.waitForFunction((t) => [...document.querySelectorAll(".msg.agent.final")].some((e) => e.textContent === "You said: " + t), {}, t);
  }
  // A reload keeps the tab's device, and its conversation.
  await a.reload();
  await a.waitForSelector("body[data-state=open]");
  assert.equal(await a.evaluate(() => window.hermes.opts.device.id), ids[0]);
  assert.deepEqual(await a.$$eval(".msg", (els) => els.map((e) => e.textContent)), ["from tab A", "You said: from tab A"],
    "the conversation is back after the reload");
  // Logging out forgets it.
  await a.bringToFront(); // tab B, opened last, is in front: input to A would wait
  await a.click("#logout");
  await logIn(a, "Tab A");
  assert.equal(await a.$$eval(".msg", (els) => els.length), 0, "logging out forgets the conversation");
  await b.evaluate(() => window.hermes.ping());
  assert.equal(await reconnects[1](), 0, "tab B did not reconnect");
  assert.equal(await b.$eval("body", (e) => e.dataset.state), "open");
  await a.close();
  await b.close();
});

test("media the agent sends by url, from another origin, is shown", { skip, timeout: 60000 }, async () => {
  const page = await newPage();
  await logIn(page, "Media URL");
  // As the gateway relays an agent's file given by url (POST .../media {url}).
  await page.evaluate((url) => window.hermes.handle({ t: "media", id: "m-url", kind: "image", mime: "image/png", filename: "dot.png", size: 68, part: 0, parts: 1, final: true, url }), mediaOrigin + "/dot.png");
  await page.waitForSelector(".msg.agent.media img");
  const loaded = await page.waitForFunction(() => {
    const img = document.querySelector(".msg.agent.media img");
    return img.complete && { width: img.naturalWidth, src: img.src };
  });
  const img = await loaded.jsonValue();
  assert.equal(img.src, mediaOrigin + "/dot.png");
  assert.equal(img.width, 1, "the image loaded (the page's CSP lets it)");
  await page.close();
});

test("keyboard only: tab to the file picker, send, answer a card", { skip, timeout: 90000 }, async () => {
  const page = await newPage();
  await page.goto(gw.http + "/");
  await page.focus("#token");
  await page.keyboard.type(gw.token);
  await page.keyboard.press("Tab");
  await page.keyboard.type("Keyboard");
  await page.keyboard.press("Enter");
  await page.waitForSelector("body[data-state=open]");
  const active = () => page.evaluate(() => {
    const e = document.activeElement;
    return e.id || (e.dataset.option ? "option:" + e.dataset.option : e.tagName);
  });
  assert.equal(await active(), "text", "the message box has the focus after log-in");
  await page.keyboard.type("typed, not clicked");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.agent.final")].some((e) => e.textContent === "You said: typed, not clicked"));

  // Back to the file picker, and a file chosen from it.
  const dir = mkdtempSync(join(tmpdir(), "hermes-kbd-"));
  const file = join(dir, "note.txt");
  writeFileSync(file, "picked by keyboard");
  for (let i = 0; i < 5 && (await active()) !== "attach"; i++) await page.keyboard.down("Shift"), await page.keyboard.press("Tab"), await page.keyboard.up("Shift");
  assert.equal(await active(), "attach", "Shift+Tab reaches the file picker");
  // Enter opens the picker: the hidden input is clicked (headless Chromium's
  // file dialog interception is not reliable enough to wait on).
  await page.evaluate(() => document.getElementById("file").addEventListener("click", () => (window.__picked = true), { once: true }));
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => window.__picked === true);
  await (await page.$("#file")).uploadFile(file);
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.agent.media .meta")].some((e) => e.textContent.startsWith("note.txt")));
  rmSync(dir, { recursive: true, force: true });

  // A card answered from the keyboard.
  await page.focus("#text");
  await page.keyboard.type("/approve pwd");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".card button[data-option=once]");
  for (let i = 0; i < 20 && (await active()) !== "option:once"; i++) await page.keyboard.down("Shift"), await page.keyboard.press("Tab"), await page.keyboard.up("Shift");
  assert.equal(await active(), "option:once", "Shift+Tab reaches the card's buttons");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".card.closed .done");
  assert.equal(await page.$eval(".card .done", (e) => e.textContent), "answered: once");
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.agent.final")].some((e) => e.textContent === "exec_approval resolved: once"));
  await page.close();
});

test("Markdown in answers, as DOM nodes: the agent's text never becomes markup", { skip, timeout: 60000 }, async () => {
  const page = await newPage();
  await logIn(page, "Markdown");
  const src = "**bold**, *it*, `x<y`, [docs](https://example.com/a) <img src=x onerror=window.__xss=1>\n```\n<b>raw</b>\n```";
  await page.type("#text", src.replace(/\n/g, ""));
  await page.$eval("#text", (e, v) => (e.value = v), src);
  await page.keyboard.press("Enter");
  await page.waitForSelector(".msg.agent.final strong");
  const out = await page.$eval(".msg.agent.final", (e) => ({
    strong: e.querySelector("strong")?.textContent,
    em: e.querySelector("em")?.textContent,
    code: e.querySelector(":scope > code")?.textContent,
    link: e.querySelector("a") && { href: e.querySelector("a").href, text: e.querySelector("a").textContent, rel: e.querySelector("a").rel },
    pre: e.querySelector("pre code")?.textContent,
    elements: [...e.querySelectorAll("*")].map((x) => x.tagName).sort(),
    xss: window.__xss ?? null,
  }));
  assert.deepEqual(out, {
    strong: "bold",
    em: "it",
    code: "x<y",
    link: { href: "https://example.com/a", text: "docs", rel: "noopener noreferrer" },
    pre: "<b>raw</b>\n",
    elements: ["A", "CODE", "CODE", "EM", "PRE", "STRONG"],
    xss: null,
  });
  await page.close();
});
