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
import { startGateway } from "./gateway.js";

const chromium = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const missing = !existsSync(chromium);
if (missing && process.env.CI === "true") throw new Error(`${chromium} is missing; CI installs it (apt-get install chromium)`);
const skip = missing ? `${chromium} is missing: apt-get install chromium to run the browser tests` : false;

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const artifacts = process.env.HERMES_ARTIFACTS || join(repo, "test-artifacts", "browser");

let gw, browser, profile;
const external = [];

before(async () => {
  if (skip) return;
  mkdirSync(artifacts, { recursive: true });
  gw = await startGateway();
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
  if (profile) rmSync(profile, { recursive: true, force: true });
});

async function newPage() {
  const page = await browser.newPage();
  await page.setViewport({ width: 800, height: 900 });
  page.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith(gw.http) && !u.startsWith(gw.ws) && !/^(data|blob|about):/.test(u)) external.push(u);
  });
  page.on("pageerror", (e) => console.error("page error:", e.message));
  return page;
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
  });
  await page.type("#text", "hello from the browser");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.agent.final")].some((e) => e.textContent === "You said: hello from the browser"));
  const seen = await page.evaluate(() => window.__seen);
  assert.equal(seen[0], "You said: ", "the answer starts with its first part: " + JSON.stringify(seen));
  assert.ok(seen.some((t) => t.length > "You said: ".length && t.length < "You said: hello from the browser".length), "a growing edit came in between: " + JSON.stringify(seen));
  await page.waitForSelector(".msg.me.sent"); // the gateway took the text
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
