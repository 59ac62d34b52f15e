// The browser client: log in with the token and a device name, then chat.
// Bundled with the SDK into static/client/app.js (go generate ./pkg/web).
import { Client, HermesError, MediaFile, MediaKindIn, Message, PromptFrame, newId } from "../../../sdk/typescript/src/index.js";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const login = $<HTMLFormElement>("login");
const chat = $<HTMLDivElement>("chat");
const messages = $<HTMLElement>("messages");
const text = $<HTMLTextAreaElement>("text");
const statusEl = $<HTMLElement>("status");
const typingEl = $<HTMLElement>("typing");
const errorEl = $<HTMLElement>("error");
const avatar = $<HTMLIFrameElement>("avatar");
const announcer = $<HTMLElement>("announce");
const loginError = $<HTMLElement>("login-error");
const server = $<HTMLInputElement>("server");

let client: Client | null = null;

// The device id is the tab's (session storage): two tabs are two devices,
// each with its own session, rather than one device taking itself back from
// the other. A reload keeps it.
function deviceId(): string {
  let id = sessionStorage.getItem("hermes.device");
  if (!id) {
    id = "web-" + newId().slice(0, 12);
    sessionStorage.setItem("hermes.device", id);
  }
  return id;
}

// Screen readers hear each answer once, when it is final, not every edit of
// a streaming bubble: the messages are not a live region, this is.
const announced = new Set<string>();
function announce(key: string, text: string) {
  if (announced.has(key)) return;
  announced.add(key);
  announcer.textContent = text;
}

function wsURL(): string {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
}

function scrollDown() {
  messages.scrollTop = messages.scrollHeight;
}

function bubble(cls: string, id?: string): HTMLDivElement {
  const el = document.createElement("div");
  el.className = "msg " + cls;
  if (id) el.dataset.id = id;
  messages.append(el);
  scrollDown();
  return el;
}

// Markdown, the little agents write: ``` blocks, `code`, **bold**, *italic*
// or _italic_, [text](http(s) link). Built as DOM nodes from text, never as
// HTML: the agent's text cannot become markup.
function markdown(el: HTMLElement, src: string) {
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

const INLINE = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|(?<![\w*])[*_]([^*_\n]+)[*_](?![\w*])|\[([^\]\n]+)\]\((https?:\/\/[^)\s]+)\)/g;

function inline(el: HTMLElement, s: string) {
  let at = 0;
  for (const m of s.matchAll(INLINE)) {
    el.append(s.slice(at, m.index));
    at = m.index! + m[0].length;
    if (m[1] !== undefined) el.append(Object.assign(document.createElement("code"), { textContent: m[1] }));
    else if (m[2] !== undefined) el.append(Object.assign(document.createElement("strong"), { textContent: m[2] }));
    else if (m[3] !== undefined) el.append(Object.assign(document.createElement("em"), { textContent: m[3] }));
    else el.append(Object.assign(document.createElement("a"), { textContent: m[4], href: m[5], target: "_blank", rel: "noopener noreferrer" }));
  }
  el.append(s.slice(at));
}

// The conversation survives a reload of the tab (as the token does, in
// session storage): the last KEEP texts, mine and the agent's. Cards and
// files are not kept: a card's buttons answer a live prompt, and a file's
// bytes do not belong in storage. Logging out forgets them.
const KEEP = 50;
type Kept = { who: "me" | "agent"; id: string; text: string };
let kept: Kept[] = [];
try {
  const v = JSON.parse(sessionStorage.getItem("hermes.history") || "[]");
  if (Array.isArray(v)) kept = v.filter((h) => h && (h.who === "me" || h.who === "agent") && typeof h.id === "string" && typeof h.text === "string");
} catch {
  kept = [];
}

function keep(who: Kept["who"], id: string, text: string) {
  const h = kept.find((x) => x.who === who && x.id === id);
  if (h) h.text = text;
  else kept.push({ who, id, text });
  if (kept.length > KEEP) kept = kept.slice(-KEEP);
  try {
    sessionStorage.setItem("hermes.history", JSON.stringify(kept));
  } catch {
    // storage full or off: the conversation is just not kept
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

function showMessage(m: Message) {
  let el = messages.querySelector<HTMLDivElement>(`.msg.agent[data-id="${CSS.escape(m.id)}"]`);
  if (!el) el = bubble("agent", m.id);
  keep("agent", m.id, m.text);
  markdown(el, m.text);
  el.classList.toggle("streaming", !m.final);
  el.classList.toggle("final", m.final);
  el.setAttribute("aria-busy", String(!m.final));
  if (m.final) announce(m.id, m.text);
  scrollDown();
}

function showMedia(f: MediaFile) {
  const el = bubble("agent media", f.id);
  el.classList.add("final");
  const src = f.data ? URL.createObjectURL(new Blob([f.data as BlobPart], { type: f.mime || "application/octet-stream" })) : f.url || "";
  let node: HTMLElement;
  if (f.kind === "image" || f.kind === "animation") {
    node = Object.assign(document.createElement("img"), { src, alt: f.filename || f.kind });
  } else if (f.kind === "voice") {
    node = Object.assign(document.createElement("audio"), { src, controls: true });
  } else if (f.kind === "video") {
    node = Object.assign(document.createElement("video"), { src, controls: true });
  } else {
    node = Object.assign(document.createElement("a"), { href: src, download: f.filename || f.id, textContent: "⬇ " + (f.filename || f.id) });
  }
  el.append(node);
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = `${f.filename || f.kind} · ${f.size} bytes${f.caption ? " · " + f.caption : ""}`;
  el.append(meta);
  announce(f.id, "File: " + meta.textContent);
}

function showPrompt(p: PromptFrame) {
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
      opts.querySelectorAll("button").forEach((x) => ((x as HTMLButtonElement).disabled = true));
    };
    opts.append(b);
  }
  el.append(opts);
  messages.append(el);
  announce(p.id, p.text + (p.command ? ": " + p.command : ""));
  scrollDown();
}

function promptDone(id: string, option?: string, expired?: boolean) {
  const el = messages.querySelector<HTMLDivElement>(`.card[data-id="${CSS.escape(id)}"]`);
  if (!el) return;
  el.querySelectorAll("button").forEach((x) => ((x as HTMLButtonElement).disabled = true));
  el.classList.add("closed");
  el.append(Object.assign(document.createElement("div"), { className: "done", textContent: expired ? "expired" : "answered: " + (option ?? "") }));
}

function setAvatar(state: string) {
  document.body.dataset.avatar = state;
  avatar.contentWindow?.postMessage({ t: "avatar", state }, "*");
}

function showError(e: unknown) {
  errorEl.textContent = e instanceof HermesError ? e.message : String(e);
  const id = e instanceof HermesError ? e.id : undefined;
  const mine = id ? messages.querySelector(`.msg.me[data-id="${CSS.escape(id)}"]`) : null;
  if (mine && (e as HermesError).code === "internal_error") setSendState(mine, "failed", "not sent");
}

// My bubbles: pending (dashed, "sending…") until the gateway has taken
// them, then sent ("✓ sent").
function mine(cls: string, id: string, label: string): HTMLDivElement {
  const el = bubble("me " + cls, id);
  el.append(document.createTextNode(label), Object.assign(document.createElement("span"), { className: "state" }));
  setSendState(el, "pending", "sending…");
  return el;
}

function setSendState(el: Element, state: "pending" | "sent" | "failed", label: string) {
  el.classList.remove("pending", "sent", "failed");
  el.classList.add(state);
  const s = el.querySelector(".state");
  if (s) s.textContent = label;
}

// What the header says of the SDK's connection states.
const STATUS: Record<string, string> = { connecting: "connecting…", open: "connected", closed: "not connected" };

function start(token: string, name: string, url: string) {
  client?.close();
  // The SDK's reconnect backoff as it is: a browser's WebSocket hides the
  // HTTP status of a refused upgrade (the edge's 503 and Retry-After), so
  // each attempt that fails before opening waits 1 s plus full jitter
  // (assumedRetryAfter; docs/clients.md).
  const c = new Client({ url, token, device: { id: deviceId(), name, platform: "web", app_version: "1.0.0" }, user: { name } });
  client = c;
  (window as any).hermes = c;
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
  c.on("typing", (on) => (typingEl.hidden = !on));
  c.on("acknowledged", (id) => {
    const el = messages.querySelector(`.msg.me[data-id="${CSS.escape(id)}"]`);
    if (el) setSendState(el, "sent", "✓ sent");
  });
  c.on("error", showError);
  c.on("disconnected", (d) => {
    if (client !== c || d.reconnect || d.reason === "closed by the app") return;
    statusEl.textContent = d.code === 1000 ? "replaced" : "disconnected";
    errorEl.textContent =
      d.code === 1000 ? "This device connected again elsewhere (another tab or window); this one has stopped. Reload to take it back." : `Disconnected: ${d.reason || d.code}`;
  });
  c.connect().then(
    () => {
      sessionStorage.setItem("hermes.token", token);
      sessionStorage.setItem("hermes.server", url);
      localStorage.setItem("hermes.name", name);
      login.hidden = true;
      chat.hidden = false;
      errorEl.textContent = ""; // a failed attempt before this one is over
      text.focus();
    },
    (e) => {
      loginError.textContent =
        e instanceof HermesError && e.code === "auth_failed"
          ? "No access: check the token."
          : e instanceof HermesError && e.code === "connect_failed"
            ? `Cannot connect to ${url}: ${e.message.replace(/^connect_failed: /, "")}`
            : String(e.message ?? e);
      login.hidden = false;
      chat.hidden = true;
    },
  );
}

login.onsubmit = (e) => {
  e.preventDefault();
  loginError.textContent = "";
  start($<HTMLInputElement>("token").value.trim(), $<HTMLInputElement>("device").value.trim() || "Browser", server.value.trim() || wsURL());
};

$<HTMLButtonElement>("logout").onclick = () => {
  client?.close();
  client = null;
  sessionStorage.removeItem("hermes.token");
  forget();
  chat.hidden = true;
  login.hidden = false;
};

$<HTMLFormElement>("composer").onsubmit = (e) => {
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
    $<HTMLFormElement>("composer").requestSubmit();
  }
};

let lastTyping = 0;
text.oninput = () => {
  if (client && Date.now() - lastTyping > 2000) {
    lastTyping = Date.now();
    client.sendTyping();
  }
};

function kindOf(mime: string): MediaKindIn {
  if (mime.startsWith("image/")) return "image";
  if (mime.startsWith("video/")) return "video";
  if (mime.startsWith("audio/")) return "audio";
  return "document";
}

async function sendBlob(blob: Blob, filename: string, kind?: MediaKindIn) {
  if (!client) return;
  try {
    const data = new Uint8Array(await blob.arrayBuffer());
    const id = client.sendFile(data, { kind: kind ?? kindOf(blob.type), mime: blob.type || undefined, filename });
    mine("file", id, `${filename} · ${data.length} bytes`);
    errorEl.textContent = "";
  } catch (err) {
    showError(err);
  }
}

const fileInput = $<HTMLInputElement>("file");
$<HTMLButtonElement>("attach").onclick = () => fileInput.click();
fileInput.onchange = async () => {
  for (const f of Array.from(fileInput.files ?? [])) await sendBlob(f, f.name);
  fileInput.value = "";
};

// Voice notes: ogg where the browser records it (sent as audio), otherwise
// the recording goes as an audio file.
let recorder: MediaRecorder | null = null;
const recordBtn = $<HTMLButtonElement>("record");
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
    const rec = new MediaRecorder(stream, ogg ? { mimeType: "audio/ogg;codecs=opus" } : undefined);
    const parts: Blob[] = [];
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
          mine("voice", id, `voice note · ${blob.size} bytes`);
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

// Back from a reload in the same tab: log in again with the kept token.
$<HTMLInputElement>("device").value = localStorage.getItem("hermes.name") ?? "";
server.value = sessionStorage.getItem("hermes.server") || wsURL();
const keptToken = sessionStorage.getItem("hermes.token");
if (keptToken) {
  restore();
  start(keptToken, localStorage.getItem("hermes.name") || "Browser", server.value);
} else {
  forget(); // a conversation kept from a session that logged out
}
