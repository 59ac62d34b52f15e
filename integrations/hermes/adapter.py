"""Hermes platform plugin "mobile": the phones of a Hermes Mobile Gateway.

The adapter connects out to the gateway router's agent API (docs/api.md):
it reads what the phones say from the event stream (GET /v1/events, resumed
from a cursor kept on disk) and answers through /v1/sessions/mobile:<device>/…
It listens on no port. chat_id is the device id.

Settings (environment, or config.yaml gateway.platforms.mobile.extra):
MOBILE_ROUTER_URL (router_url), MOBILE_AGENT_TOKEN (agent_token),
MOBILE_DELIVER_TOKEN (deliver_token, for out-of-process sends),
MOBILE_HOME_DEVICE (home device), MOBILE_CURSOR_FILE (cursor_file).
"""

import asyncio
import base64
import contextlib
import inspect
import json
import logging
import mimetypes
import os
import random
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Optional
from urllib.parse import quote

try:
    import aiohttp
except ImportError:  # check_requirements reports it
    aiohttp = None

from gateway.config import Platform
from gateway.platforms.base import (
    BasePlatformAdapter,
    MessageEvent,
    MessageType,
    SendResult,
    cache_audio_from_bytes,
    cache_document_from_bytes,
    cache_image_from_bytes,
    cache_video_from_bytes,
)

logger = logging.getLogger(__name__)

PLATFORM = "mobile"
DEFAULT_ROUTER_URL = "http://127.0.0.1:8788"

# Bounds (README, "Use with Hermes"): what the router may send the plugin.
MAX_FILE_BYTES = 8 * 1024 * 1024  # a file either way, as the protocol has it
MAX_EVENT_LINE = 1024 * 1024  # one line of the event stream
MAX_OPEN_CARDS = 1000  # cards waiting for an answer; the oldest are forgotten
MAX_TEXT_CHARS = 100_000  # an agent message, as the router takes it
MAX_DEVICE_CHARS = 120

# Reconnecting to the event stream: from BACKOFF_MIN doubling to BACKOFF_MAX,
# with jitter; a stream silent for STREAM_IDLE (the router sends a keepalive
# every 15 s) is taken for dead.
BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0
STREAM_IDLE = 45.0
REQUEST_TIMEOUT = 45.0  # a router call may wait up to 30 s while NATS is away

_IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
_VOICE_EXTS = {".ogg", ".opus", ".mp3", ".wav", ".m4a", ".flac"}
_VIDEO_EXTS = {".mp4", ".mov", ".webm", ".mkv", ".avi", ".3gp"}


def _setting(extra: dict, env: str, key: str, default: str = "") -> str:
    """The environment wins over config.yaml's extra."""
    return (os.getenv(env) or str(extra.get(key) or "") or default).strip()


def _hermes_home() -> Path:
    return Path(os.getenv("HERMES_HOME") or Path.home() / ".hermes")


def _session_path(router_url: str, device: str, what: str) -> str:
    return f"{router_url}/v1/sessions/{quote('mobile:' + device, safe=':')}/{what}"


def parse_device(ref: str) -> Optional[str]:
    """The device id of a target: "<device>" or "mobile:<device>", else None."""
    ref = (ref or "").strip()
    if ref.lower().startswith(PLATFORM + ":"):
        ref = ref[len(PLATFORM) + 1:].strip()
    if not ref or len(ref) > MAX_DEVICE_CHARS:
        return None
    if any(c.isspace() or ord(c) < 32 or c == "/" for c in ref):
        return None
    return ref


def _media_kind(path: str, force_document: bool = False) -> str:
    ext = Path(path).suffix.lower()
    if force_document:
        return "document"
    if ext == ".gif":
        return "animation"
    if ext in _IMAGE_EXTS:
        return "image"
    if ext in _VOICE_EXTS:
        return "voice"
    if ext in _VIDEO_EXTS:
        return "video"
    return "document"


def _file_media(path: str, kind: str, caption: Optional[str] = None, file_name: Optional[str] = None) -> dict:
    """A media body for the router from a local file, refusing one over 8 MiB before reading it."""
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{path} is {size} bytes; the gateway takes files up to {MAX_FILE_BYTES}")
    data = Path(path).read_bytes()
    name = file_name or Path(path).name
    body = {"kind": kind, "filename": name, "data": base64.b64encode(data).decode("ascii")}
    mime = mimetypes.guess_type(name)[0]
    if mime:
        body["mime"] = mime
    if caption:
        body["caption"] = caption
    return body


class RouterError(Exception):
    """A router answer that is not 2xx: status, error code and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code

    @property
    def retryable(self) -> bool:
        return self.status >= 500


async def _post(session, url: str, token: str, body: dict) -> dict:
    async with session.post(url, json=body, headers={"Authorization": "Bearer " + token}) as resp:
        return await _answer(resp)


async def _answer(resp) -> dict:
    raw = await resp.content.read(64 * 1024)
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        doc = {}
    if resp.status // 100 != 2:
        raise RouterError(resp.status, str(doc.get("error") or "http_error"), str(doc.get("message") or raw[:200]))
    return doc


def _failed(err: Exception) -> SendResult:
    retryable = isinstance(err, RouterError) and err.retryable or not isinstance(err, (RouterError, ValueError, OSError))
    return SendResult(success=False, error=str(err) or type(err).__name__, retryable=retryable)


class MobileAdapter(BasePlatformAdapter):
    """The phones of a Hermes Mobile Gateway, reached through its router."""

    SUPPORTS_MESSAGE_EDITING = True
    MAX_MESSAGE_LENGTH = MAX_TEXT_CHARS

    def __init__(self, config, **kwargs):
        super().__init__(config, Platform(PLATFORM))
        extra = getattr(config, "extra", None) or {}
        self.router_url = _setting(extra, "MOBILE_ROUTER_URL", "router_url", DEFAULT_ROUTER_URL).rstrip("/")
        self.agent_token = _setting(extra, "MOBILE_AGENT_TOKEN", "agent_token")
        default_cursor = str(_hermes_home() / "mobile" / "cursor")
        self.cursor_file = Path(_setting(extra, "MOBILE_CURSOR_FILE", "cursor_file", default_cursor))
        self.cursor = ""
        self._http = None
        self._reader: Optional[asyncio.Task] = None
        # card id → (kind, session_key, hermes id, choices, chat_id)
        self._cards: "OrderedDict[str, tuple]" = OrderedDict()

    @property
    def name(self) -> str:
        return "Mobile"

    # ── lifecycle ────────────────────────────────────────────────────────

    async def connect(self, *, is_reconnect: bool = False) -> bool:
        """Starts reading the event stream from the saved cursor."""
        if aiohttp is None:
            self._set_fatal_error("missing_dependency", "aiohttp is not installed", retryable=False)
            return False
        if not self.agent_token:
            self._set_fatal_error("config_missing", "MOBILE_AGENT_TOKEN is not set", retryable=False)
            return False
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, sock_connect=10),
                read_bufsize=MAX_EVENT_LINE,
            )
        self.cursor = self._load_cursor()
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_events())
        self._mark_connected()
        logger.info("[Mobile] reading events of %s after cursor %r", self.router_url, self.cursor)
        return True

    async def disconnect(self) -> None:
        self._mark_disconnected()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def get_chat_info(self, chat_id: str) -> Dict[str, Any]:
        return {"name": chat_id, "type": "dm", "chat_id": chat_id}

    # ── the event stream ────────────────────────────────────────────────

    def _load_cursor(self) -> str:
        with contextlib.suppress(OSError):
            return self.cursor_file.read_text().strip()
        return self.cursor

    def _save_cursor(self, cursor: str) -> None:
        """Writes the cursor atomically: a crash leaves the old one or the new one."""
        self.cursor = cursor
        try:
            self.cursor_file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cursor_file.parent, prefix=".cursor-")
            with os.fdopen(fd, "w") as f:
                f.write(cursor)
            os.replace(tmp, self.cursor_file)
        except OSError as e:
            logger.warning("[Mobile] cannot save the cursor to %s: %s", self.cursor_file, e)

    async def _read_events(self) -> None:
        """Reads the stream until disconnect, reconnecting with backoff; an
        event is handled, then the cursor moves past it, so a reconnect
        neither skips nor repeats one."""
        delay = BACKOFF_MIN
        while True:
            try:
                async for cursor, event in self._stream():
                    delay = BACKOFF_MIN
                    await self._dispatch(event)
                    self._save_cursor(cursor)
                logger.info("[Mobile] event stream ended; reconnecting")
            except asyncio.CancelledError:
                raise
            except RouterError as e:
                if e.status in (401, 403):
                    logger.error("[Mobile] the router refused the agent token: %s", e)
                    self._set_fatal_error("auth_failed", str(e), retryable=False)
                    await self._notify_fatal_error()
                    return
                logger.warning("[Mobile] event stream: %s; retrying in %.1fs", e, delay)
            except Exception as e:
                logger.warning("[Mobile] event stream: %s; retrying in %.1fs", e or type(e).__name__, delay)
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, BACKOFF_MAX)

    async def _stream(self):
        """Yields (cursor, event) from one SSE connection."""
        url = f"{self.router_url}/v1/events?format=sse&cursor={quote(self.cursor)}"
        headers = {"Authorization": "Bearer " + self.agent_token, "Accept": "text/event-stream"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=STREAM_IDLE)
        async with self._http.get(url, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                await _answer(resp)
            cursor, data = "", []
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                line = line.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if cursor and data:
                        try:
                            event = json.loads("\n".join(data))
                        except ValueError:
                            logger.warning("[Mobile] skipping an event that is not JSON at %s", cursor)
                            event = None
                        if isinstance(event, dict):
                            yield cursor, event
                    cursor, data = "", []
                elif line.startswith("id:"):
                    cursor = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))

    async def _dispatch(self, ev: dict) -> None:
        kind = ev.get("kind")
        if kind == "prompt":
            await self._resolve_card(ev)
            return
        if kind not in ("text", "audio", "media"):
            logger.debug("[Mobile] ignoring an event of kind %r", kind)
            return
        device = str(ev.get("device") or "")
        if not device:
            return
        text = str(ev.get("text") or "")
        msg_type = MessageType.COMMAND if kind == "text" and text.startswith("/") else MessageType.TEXT
        media_urls, media_types = [], []
        media = ev.get("media") or {}
        if kind in ("audio", "media") and media.get("blob"):
            try:
                msg_type, path = await self._cache_media(kind, media, ev.get("format") or "")
                media_urls, media_types = [path], [str(media.get("mime") or "")]
            except (RouterError, ValueError, OSError) as e:
                if isinstance(e, RouterError) and e.status != 404:
                    raise  # the router is away: read this event again later
                logger.warning("[Mobile] the file of %s cannot be had: %s", ev.get("id"), e)
                text = (text + "\n" if text else "") + "[the file was no longer available]"
        source = self.build_source(
            chat_id=device,
            chat_name=str(ev.get("user") or device),
            chat_type="dm",
            user_id=str(ev.get("user_id") or device),
            user_name=str(ev.get("user") or "") or None,
        )
        await self.handle_message(MessageEvent(
            text=text, message_type=msg_type, source=source, raw_message=ev,
            message_id=str(ev.get("id") or "") or None, media_urls=media_urls, media_types=media_types,
        ))

    async def _cache_media(self, kind: str, media: dict, audio_format: str):
        """Fetches an upload's bytes by reference and caches them the way Hermes's tools expect."""
        data = await self._fetch_blob(str(media["blob"]))
        filename = str(media.get("filename") or "")
        ext = Path(filename).suffix.lower() or mimetypes.guess_extension(str(media.get("mime") or "")) or ""
        if kind == "audio":
            return MessageType.VOICE, cache_audio_from_bytes(data, "." + (audio_format or "ogg"))
        mkind = media.get("kind")
        if mkind == "image":
            with contextlib.suppress(ValueError):  # not an image after all: keep it as a document
                return MessageType.PHOTO, cache_image_from_bytes(data, ext or ".jpg")
        elif mkind == "video":
            return MessageType.VIDEO, cache_video_from_bytes(data, ext or ".mp4")
        elif mkind == "audio":
            return MessageType.AUDIO, cache_audio_from_bytes(data, ext or ".ogg")
        return MessageType.DOCUMENT, cache_document_from_bytes(data, filename or "document" + ext)

    async def _fetch_blob(self, key: str) -> bytes:
        url = f"{self.router_url}/v1/blobs/{quote(key, safe='')}"
        async with self._http.get(url, headers={"Authorization": "Bearer " + self.agent_token}) as resp:
            if resp.status != 200:
                await _answer(resp)
            data = await resp.content.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"blob {key} is larger than {MAX_FILE_BYTES} bytes")
            return data

    # ── cards ─────────────────────────────────────────────────────────────

    def _remember_card(self, card_id: str, entry: tuple) -> None:
        self._cards[card_id] = entry
        while len(self._cards) > MAX_OPEN_CARDS:
            old, _ = self._cards.popitem(last=False)
            logger.warning("[Mobile] forgetting card %s: more than %d are open", old, MAX_OPEN_CARDS)

    async def _resolve_card(self, ev: dict) -> None:
        """Hands a card's answer (or its expiry) to Hermes's own resolvers."""
        p = ev.get("prompt") or {}
        entry = self._cards.pop(str(p.get("id") or ""), None)
        if entry is None:
            logger.info("[Mobile] answer to an unknown card %s (sent before a restart?)", p.get("id"))
            return
        kind, session_key, hermes_id, choices, chat_id = entry
        option, text = str(p.get("option") or ""), str(p.get("text") or "")
        if kind == "exec_approval":
            from tools.approval import resolve_gateway_approval
            resolve_gateway_approval(session_key, option or "deny")
        elif kind == "slash_confirm":
            from tools import slash_confirm
            answer = await slash_confirm.resolve(session_key, hermes_id, option or "cancel")
            if answer:
                await self.send(chat_id, answer)
        elif kind == "clarify":
            from tools import clarify_gateway
            if option.startswith("c") and option[1:].isdigit() and int(option[1:]) < len(choices):
                clarify_gateway.resolve_gateway_clarify(hermes_id, choices[int(option[1:])])
            elif text and not p.get("expired"):
                clarify_gateway.resolve_gateway_clarify(hermes_id, text)
            else:  # "other" without text, or expired: the next typed message answers
                clarify_gateway.mark_awaiting_text(hermes_id)

    async def _card(self, chat_id: str, body: dict, entry: tuple) -> SendResult:
        try:
            doc = await _post(self._http, _session_path(self.router_url, chat_id, "prompts"), self.agent_token, body)
        except Exception as e:
            return _failed(e)
        self._remember_card(str(doc.get("id")), entry)
        return SendResult(success=True, message_id=str(doc.get("id")))

    async def send_exec_approval(self, chat_id: str, command: str, session_key: str,
                                 description: str = "dangerous command", metadata: Optional[dict] = None,
                                 **kwargs) -> SendResult:
        """An exec_approval card; the answer goes to tools.approval.resolve_gateway_approval."""
        body = {"kind": "exec_approval", "text": "Run this command?", "command": command,
                "description": description or ""}
        return await self._card(chat_id, body, ("exec_approval", session_key, "", [], chat_id))

    async def send_slash_confirm(self, chat_id: str, title: str, message: str, session_key: str,
                                 confirm_id: str, metadata: Optional[dict] = None, **kwargs) -> SendResult:
        """A slash_confirm card; the answer goes to tools.slash_confirm.resolve."""
        text = f"{title}\n\n{message}" if title and message else (title or message or "Confirm?")
        body = {"kind": "slash_confirm", "text": text}
        return await self._card(chat_id, body, ("slash_confirm", session_key, confirm_id, [], chat_id))

    async def send_clarify(self, chat_id: str, question: str, choices: Optional[list], clarify_id: str,
                           session_key: str, metadata: Optional[dict] = None, **kwargs) -> SendResult:
        """A clarify card (c0… and other); the answer goes to tools.clarify_gateway."""
        labels = [str(c) for c in (choices or []) if str(c)][:32]
        body = {"kind": "clarify", "text": question or "?", "choices": labels}
        return await self._card(chat_id, body, ("clarify", session_key, clarify_id, labels, chat_id))

    # ── sending ───────────────────────────────────────────────────────────

    async def _say(self, chat_id: str, what: str, body: dict) -> SendResult:
        if self._http is None:
            return SendResult(success=False, error="Not connected", retryable=True)
        try:
            doc = await _post(self._http, _session_path(self.router_url, chat_id, what), self.agent_token, body)
        except Exception as e:
            return _failed(e)
        return SendResult(success=True, message_id=doc.get("id"), raw_response=doc)

    async def send(self, chat_id: str, content: str, reply_to: Optional[str] = None,
                   metadata: Optional[Dict[str, Any]] = None) -> SendResult:
        return await self._say(chat_id, "messages", {"text": content[:MAX_TEXT_CHARS] or " "})

    async def edit_message(self, chat_id: str, message_id: str, content: str, *,
                           finalize: bool = False) -> SendResult:
        """The complete new text of message_id; finalize marks the last edit."""
        body = {"id": message_id, "text": content[:MAX_TEXT_CHARS] or " ", "edit": True, "final": bool(finalize)}
        return await self._say(chat_id, "messages", body)

    async def send_typing(self, chat_id: str, metadata=None) -> None:
        await self._say(chat_id, "typing", {})

    async def stop_typing(self, chat_id: str) -> None:
        await self._say(chat_id, "typing", {"stop": True})

    async def _send_file(self, chat_id, path, kind, caption=None, reply_to=None, file_name=None) -> SendResult:
        try:
            body = _file_media(path, kind, caption, file_name)
        except (OSError, ValueError) as e:
            return _failed(e)
        if reply_to:
            body["reply_to"] = reply_to
        return await self._say(chat_id, "media", body)

    async def _send_url(self, chat_id, kind, url, caption, reply_to) -> SendResult:
        try:
            body = _url_media(kind, url, caption, reply_to)
        except (OSError, ValueError) as e:
            return _failed(e)
        return await self._say(chat_id, "media", body)

    async def send_image(self, chat_id: str, image_url: str, caption: Optional[str] = None,
                         reply_to: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None) -> SendResult:
        return await self._send_url(chat_id, "image", image_url, caption, reply_to)

    async def send_animation(self, chat_id: str, animation_url: str, caption: Optional[str] = None,
                             reply_to: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None) -> SendResult:
        return await self._send_url(chat_id, "animation", animation_url, caption, reply_to)

    async def send_image_file(self, chat_id: str, image_path: str, caption: Optional[str] = None,
                              reply_to: Optional[str] = None, **kwargs) -> SendResult:
        return await self._send_file(chat_id, image_path, "image", caption, reply_to)

    async def send_voice(self, chat_id: str, audio_path: str, caption: Optional[str] = None,
                         reply_to: Optional[str] = None, **kwargs) -> SendResult:
        return await self._send_file(chat_id, audio_path, "voice", caption, reply_to)

    async def send_video(self, chat_id: str, video_path: str, caption: Optional[str] = None,
                         reply_to: Optional[str] = None, **kwargs) -> SendResult:
        return await self._send_file(chat_id, video_path, "video", caption, reply_to)

    async def send_document(self, chat_id: str, file_path: str, caption: Optional[str] = None,
                            file_name: Optional[str] = None, reply_to: Optional[str] = None, **kwargs) -> SendResult:
        return await self._send_file(chat_id, file_path, "document", caption, reply_to, file_name)


def _url_media(kind: str, url: str, caption: Optional[str], reply_to: Optional[str]) -> dict:
    if url.startswith("file://"):
        from urllib.parse import unquote
        body = _file_media(unquote(url[7:]), kind, caption)
        if reply_to:
            body["reply_to"] = reply_to
        return body
    body = {"kind": kind, "url": url, "filename": Path(url.split("?")[0]).name or kind}
    if caption:
        body["caption"] = caption
    if reply_to:
        body["reply_to"] = reply_to
    return body


# ── out of process: hermes send --to mobile:<device>, cron deliver=mobile ──

async def standalone_send(pconfig, chat_id: str, message: str, *, thread_id: Optional[str] = None,
                          media_files: Optional[list] = None, force_document: bool = False) -> dict:
    """Delivers through the router's POST /v1/deliver (a deliver token), to a
    phone that is online now: a text, then each file."""
    extra = getattr(pconfig, "extra", None) or {}
    router = _setting(extra, "MOBILE_ROUTER_URL", "router_url", DEFAULT_ROUTER_URL).rstrip("/")
    token = _setting(extra, "MOBILE_DELIVER_TOKEN", "deliver_token")
    if not token:
        return {"error": "MOBILE_DELIVER_TOKEN is not set"}
    device = parse_device(chat_id or "") or parse_device(os.getenv("MOBILE_HOME_DEVICE", ""))
    if not device:
        return {"error": f"no device to deliver to: {chat_id!r} (and MOBILE_HOME_DEVICE is not set)"}
    if aiohttp is None:
        return {"error": "aiohttp is not installed"}
    bodies = [{"target": device, "text": message}] if message else []
    try:
        for path in media_files or []:
            path = path[0] if isinstance(path, (tuple, list)) else path
            bodies.append({"target": device, "media": _file_media(path, _media_kind(path, force_document))})
        if not bodies:
            return {"error": "nothing to send"}
        ids = []
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, sock_connect=10)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for body in bodies:
                ids.append((await _post(http, router + "/v1/deliver", token, body)).get("id"))
    except (RouterError, OSError, ValueError, aiohttp.ClientError, asyncio.TimeoutError) as e:
        return {"error": f"mobile delivery failed: {e or type(e).__name__}"}
    return {"success": True, "platform": PLATFORM, "chat_id": device, "message_id": ids[0]}


def parse_target_ref(ref: str):
    """hermes send --to mobile:<device>: (device, None), or None when it is not one."""
    device = parse_device(ref)
    return (device, None) if device else None


def validate_target_ref(ref: str):
    return True if parse_device(ref) else "a device id: up to 120 characters, no spaces or slashes"


# ── registration ───────────────────────────────────────────────────────────

def check_requirements() -> bool:
    return aiohttp is not None


def validate_config(config) -> bool:
    extra = getattr(config, "extra", None) or {}
    return bool(_setting(extra, "MOBILE_AGENT_TOKEN", "agent_token"))


def env_enablement() -> Optional[dict]:
    """Enables the platform from the environment: the agent token is the minimum."""
    if not os.getenv("MOBILE_AGENT_TOKEN", "").strip():
        return None
    seed = {"router_url": os.getenv("MOBILE_ROUTER_URL", DEFAULT_ROUTER_URL).strip()}
    home = os.getenv("MOBILE_HOME_DEVICE", "").strip()
    if home:
        seed["home_channel"] = {"chat_id": home, "name": "Home"}
    return seed


PLATFORM_HINT = (
    "You are talking to the user's phone through the Hermes Mobile app. It renders markdown, "
    "plays voice messages and shows images, videos and documents you send; approvals and "
    "questions appear as buttons. Keep answers readable on a small screen."
)


def register(ctx):
    """Plugin entry point: registers the "mobile" platform."""
    fields = dict(
        name=PLATFORM,
        label="Hermes Mobile",
        adapter_factory=lambda cfg: MobileAdapter(cfg),
        check_fn=check_requirements,
        validate_config=validate_config,
        required_env=["MOBILE_ROUTER_URL", "MOBILE_AGENT_TOKEN"],
        install_hint="needs aiohttp (pip install aiohttp)",
        env_enablement_fn=env_enablement,
        cron_deliver_env_var="MOBILE_HOME_DEVICE",
        standalone_sender_fn=standalone_send,
        parse_target_ref_fn=parse_target_ref,
        validate_target_ref_fn=validate_target_ref,
        allowed_users_env="MOBILE_ALLOWED_USERS",
        allow_all_env="MOBILE_ALLOW_ALL_USERS",
        max_message_length=MAX_TEXT_CHARS,
        emoji="📱",
        platform_hint=PLATFORM_HINT,
    )
    params = inspect.signature(ctx.register_platform).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        fields = {k: v for k, v in fields.items() if k in params}  # an older Hermes
    ctx.register_platform(**fields)
