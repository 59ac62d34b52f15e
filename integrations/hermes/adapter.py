"""Hermes platform plugin "mobile": the phones of a Hermes Mobile Gateway.

The adapter connects out to the gateway router's agent API (docs/api.md):
it reads what the phones say from the event stream (GET /v1/events, resumed
from a cursor kept on disk) and answers through /v1/sessions/mobile:<device>/…
It listens on no port. chat_id is the device id.

Settings (environment, or config.yaml gateway.platforms.mobile.extra):
MOBILE_ROUTER_URL (router_url), MOBILE_AGENT_TOKEN (agent_token),
MOBILE_DELIVER_TOKEN (deliver_token, for out-of-process sends),
MOBILE_HOME_DEVICE (home device), MOBILE_CURSOR_FILE (cursor_file).
The tokens may be an owner's keys of the gateway's tenants file
(hmt_<owner>.<key id>.<secret>): they are sent as they are.
"""

import asyncio
import base64
import hashlib
import contextlib
import inspect
import json
import logging
import mimetypes
import os
import random
import re
import tempfile
import time
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

# Bounds (integrations/hermes/README.md, "Bounds").
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
MAX_INFLIGHT = 1000  # events read but not yet handled (all devices); the reader waits past it

_IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
_VOICE_EXTS = {".ogg", ".opus", ".mp3", ".wav", ".m4a", ".flac"}
_VIDEO_EXTS = {".mp4", ".mov", ".webm", ".mkv", ".avi", ".3gp"}


def _setting(extra: dict, env: str, key: str, default: str = "") -> str:
    """The environment wins over config.yaml's extra."""
    return (os.getenv(env) or str(extra.get(key) or "") or default).strip()


def _hermes_home() -> Path:
    return Path(os.getenv("HERMES_HOME") or Path.home() / ".hermes")


def _session_path(router_url: str, chat_id: str, what: str) -> str:
    return f"{router_url}/v1/sessions/{quote('mobile:' + _device_of(chat_id), safe=':')}/{what}"


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


# ── send targets on a Hermes without parse_target_ref_fn (v0.18) ──────────
#
# Hermes 0.18's send_message (hermes send, the send_message tool) takes an
# explicit target only when it is numeric; a name goes through the channel
# directory, and a name that resolves to a non-numeric id falls back to the
# home channel. So on such a Hermes a device's chat_id is a number derived
# from its id (the device id itself when that is all digits), kept in
# $HERMES_HOME/mobile/targets.json, and channel_aliases.json names it with
# the device id: `--to mobile:tel-1` resolves to that number, which the
# plugin turns back into tel-1.

MAX_TARGETS = 10_000  # devices remembered in targets.json
_TARGETS: Dict[str, str] = {}  # number → device, of this process


def _numeric_targets() -> bool:
    fields = _entry_fields()
    return fields is not None and "parse_target_ref_fn" not in fields


def _target_number(device: str) -> str:
    if device.isdigit():
        return device
    return str(10 ** 16 + int(hashlib.sha256(device.encode("utf-8")).hexdigest()[:13], 16))


def _read_json(path: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict):
            return doc
    return {}


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + "-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _remember_target(device: str) -> str:
    """The chat_id of device on a Hermes without target hooks, remembered for hermes send."""
    number = _target_number(device)
    if number == device or _TARGETS.get(number) == device:
        return number
    _TARGETS[number] = device
    targets_file = _hermes_home() / "mobile" / "targets.json"
    try:
        table = _read_json(targets_file)
        if table.get(number) != device and len(table) < MAX_TARGETS:
            table[number] = device
            _write_json(targets_file, table)
        aliases_file = _hermes_home() / "channel_aliases.json"
        aliases = _read_json(aliases_file)
        names = aliases.setdefault(PLATFORM, {})
        if isinstance(names, dict) and number not in names and len(names) < MAX_TARGETS:
            names[number] = device
            _write_json(aliases_file, aliases)
    except OSError as e:
        logger.warning("[Mobile] cannot remember the send target of %s: %s", device, e)
    return number


def _device_of(chat_id: str) -> str:
    """The device of a chat_id (a number of targets.json, or the device id itself)."""
    chat_id = str(chat_id or "")
    if not chat_id.isdigit():
        return chat_id
    if chat_id not in _TARGETS:
        device = _read_json(_hermes_home() / "mobile" / "targets.json").get(chat_id)
        if not isinstance(device, str):
            return chat_id
        _TARGETS[chat_id] = device
    return _TARGETS[chat_id]


class RouterError(Exception):
    """A router answer that is not 2xx: status, error code and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code

    @property
    def retryable(self) -> bool:
        return self.status >= 500


async def _post(session, url: str, token: str, body: dict, headers: Optional[dict] = None) -> dict:
    async with session.post(url, json=body, headers={"Authorization": "Bearer " + token, **(headers or {})}) as resp:
        return await _answer(resp)


# W3C trace context (traceparent): version-trace_id-parent_id-flags, lower-case hex.
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


async def _answer(resp) -> dict:
    raw = await resp.content.read(64 * 1024)
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        doc = {}
    if resp.status // 100 != 2:
        raise RouterError(resp.status, str(doc.get("error") or "http_error"), str(doc.get("message") or raw[:200]))
    return doc


def _retryable(err: Exception) -> bool:
    """Whether sending again is safe and may help: the router answered 5xx
    (it keeps nothing of a failed request), or the connection to it could not
    be made. A timeout or a connection lost mid-request is not: the message may
    have been delivered."""
    if isinstance(err, RouterError):
        return err.retryable
    if aiohttp is not None and isinstance(err, aiohttp.ClientConnectorError):
        return True
    return isinstance(err, ConnectionRefusedError)


def _failed(err: Exception) -> SendResult:
    text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return SendResult(success=False, error=text, retryable=_retryable(err))


# ── binding cards to Hermes's waits ───────────────────────────────────────

APPROVAL_POLL = 0.5  # how often open approval cards are checked against Hermes's queue
CARD_MARGIN = 2  # seconds a card closes before Hermes stops waiting for it


class _Card:
    """An open card: what it answers in Hermes. binding (approvals) is
    ("request", request_id) on Hermes ≥ 0.21 and ("entry", queue entry) on 0.18;
    multi marks a multi-select clarify."""

    __slots__ = ("kind", "session_key", "hermes_id", "choices", "chat_id", "options", "binding", "multi")

    def __init__(self, kind, session_key, hermes_id, choices, chat_id, options=None, binding=None, multi=False):
        self.kind, self.session_key, self.hermes_id = kind, session_key, hermes_id
        self.choices, self.chat_id, self.options, self.binding = choices, chat_id, options or [], binding
        self.multi = multi


DEFAULT_DESCRIPTION = "dangerous command"  # what Hermes ≤ 0.21 shows for an approval without a description


def _default_reason() -> str:
    """What Hermes shows for an approval without a description: on the newest
    line its localized default reason (ea_default_reason_text(), in
    gateway.platforms.base_exec_approval), before it "dangerous command"."""
    for module in ("gateway.platforms.base_exec_approval", "gateway.platforms.base"):
        try:
            return str(getattr(__import__(module, fromlist=["x"]), "ea_default_reason_text")()) or DEFAULT_DESCRIPTION
        except Exception:
            continue
    return DEFAULT_DESCRIPTION


def _default_descriptions() -> set:
    """Every default description a card of this Hermes may show."""
    return {DEFAULT_DESCRIPTION, _default_reason()}


def _description(value) -> str:
    """An approval's description as Hermes shows it: empty or missing is its default reason."""
    return str(value or "") or _default_reason()


def _same_description(stored, shown) -> bool:
    """Whether the description a card shows is the one of a pending approval:
    the same text, or, for an approval without one, any default Hermes shows."""
    stored, shown = str(stored or ""), str(shown or "")
    if stored:
        return shown == stored
    return not shown or shown in _default_descriptions()


def _shown(command: str) -> str:
    """The command as Hermes shows it in a prompt (credentials redacted)."""
    try:
        from agent.redact import redact_sensitive_text
        return redact_sensitive_text(str(command or ""), force=True)
    except Exception:
        return str(command or "")


def _same_request(data: dict, command: str, description: str) -> bool:
    raw = str(data.get("command") or "")
    return (command in (raw, _shown(raw))) and _same_description(data.get("description"), description)


def _bind_approval(session_key: str, command: str, description: str, taken: set, request_id: str = ""):
    """The pending approval a card for (command, description) answers: the one
    Hermes names (metadata approval_id) when it is pending, else the oldest one
    of the session showing them that no open card answers yet; None when there
    is none (the card is then not sent)."""
    from tools import approval
    lister = getattr(approval, "list_gateway_approvals", None)
    if lister is not None:  # Hermes ≥ 0.21: request ids
        if request_id:
            named = ("request", request_id)
            pending = any(d.get("request_id") == request_id for d in lister(session_key))
            return named if pending and named not in taken else None
        for data in lister(session_key):
            binding = ("request", data.get("request_id"))
            if binding[1] and binding not in taken and _same_request(data, command, description):
                return binding
        return None
    queues, lock = getattr(approval, "_gateway_queues", None), getattr(approval, "_lock", None)
    if queues is None or lock is None:
        return None  # neither: fail safe, Hermes asks in text
    with lock:  # Hermes 0.18: the queue entry itself
        for entry in queues.get(session_key, []):
            binding = ("entry", entry)
            if binding not in taken and _same_request(getattr(entry, "data", None) or {}, command, description):
                return binding
    return None


def _approval_pending(card: _Card) -> bool:
    """Whether Hermes still waits for the approval card answers."""
    from tools import approval
    how, what = card.binding
    if how == "request":
        return any(d.get("request_id") == what for d in approval.list_gateway_approvals(card.session_key))
    with approval._lock:
        return what in approval._gateway_queues.get(card.session_key, [])


def _resolve_approval(card: _Card, choice: str) -> bool:
    """Resolves exactly the approval of card; False when it is no longer pending."""
    from tools import approval
    how, what = card.binding
    if how == "request":
        return approval.resolve_gateway_approval(card.session_key, choice, request_id=what) > 0
    # Hermes 0.18 resolves only the oldest approval of a session; this one is
    # taken out of the queue and woken the way resolve_gateway_approval does.
    with approval._lock:
        queue = approval._gateway_queues.get(card.session_key)
        if not queue or what not in queue:
            return False
        queue.remove(what)
        if not queue:
            approval._gateway_queues.pop(card.session_key, None)
    what.result = choice
    what.event.set()
    return True


def _expire_approval(card: _Card) -> None:
    """The card expired unanswered: nobody refused the command. Where Hermes can
    withdraw a pending approval (withdraw_gateway_approval) it is withdrawn, so
    the wait ends at once as "withdrawn", never as the user's deny; elsewhere it
    stays pending and Hermes's own timeout (2 s later) ends it as a timeout."""
    from tools import approval
    how, what = card.binding
    withdraw = getattr(approval, "withdraw_gateway_approval", None)
    if how == "request" and withdraw is not None:
        withdraw(card.session_key, what, "the approval card on the phone expired unanswered")


# Settle hooks of open approval cards by request id. Hermes keeps one settle
# per request and its turn runner registers its own (the timeout notice) after
# the card is sent, replacing the plugin's; _chain_settles makes such a later
# registration run the plugin's too.
_OUR_SETTLES: Dict[str, Any] = {}


def _chain_settles() -> None:
    """Wraps tools.approval.register_gateway_settle once so a hook registered
    for a request with an open card runs that card's close after it."""
    try:
        from tools import approval
    except Exception:
        return
    register = getattr(approval, "register_gateway_settle", None)
    if register is None or getattr(register, "_mobile_chained", False):
        return

    def register_gateway_settle(session_key, request_id, settle):
        mine = _OUR_SETTLES.get(request_id)
        if mine is not None and settle is not mine:
            theirs = settle

            def settle(*args, **kwargs):
                try:
                    theirs(*args, **kwargs)
                finally:
                    mine(*args, **kwargs)
        return register(session_key, request_id, settle)
    register_gateway_settle._mobile_chained = True
    register_gateway_settle.__wrapped__ = register
    approval.register_gateway_settle = register_gateway_settle


def _hermes_setting(getters, default: float) -> float:
    for module, name in getters:
        try:
            value = getattr(__import__(module, fromlist=[name]), name)
            return float(value() if callable(value) else value)
        except Exception:
            continue
    return default


def _approval_timeout() -> float:
    """approvals.timeout: how long Hermes waits for an approval (300 s by default)."""
    return _hermes_setting([("tools.approval_context", "_get_approval_timeout"),
                            ("tools.approval", "_get_approval_timeout")], 300)


def _approval_wait(metadata: Optional[dict]) -> float:
    """How long Hermes still waits for the approval a card shows: until the
    wait's expires_at where Hermes sends it (metadata, the newest line: a
    time.monotonic() deadline of this process), else approvals.timeout."""
    timeout = _approval_timeout()
    expires = (metadata or {}).get("expires_at")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        left = float(expires) - time.monotonic()
        if left <= max(timeout, 0) + 60:  # a deadline of another clock is not ours to read
            return max(left, 0.001)
    return timeout


def _clarify_timeout() -> float:
    return _hermes_setting([("tools.clarify_gateway", "get_clarify_timeout")], 3600)


def _slash_confirm_timeout() -> float:
    return _hermes_setting([("tools.slash_confirm", "DEFAULT_TIMEOUT_SECONDS")], 300)


UNTIL_CLOSED = -1  # a card's ttl for a wait without a limit: the router's longest (MOBILE_PROMPT_MAX_TTL)


def _card_ttl(wait: float) -> int:
    """A card's lifetime (the router's ttl): it closes CARD_MARGIN seconds
    before Hermes's wait ends. UNTIL_CLOSED when Hermes waits without a limit
    (a wait of 0 or less): the card then lives until answered or closed, at
    most the router's MOBILE_PROMPT_MAX_TTL."""
    if wait <= 0:
        return UNTIL_CLOSED
    return max(1, int(wait + 0.5) - CARD_MARGIN)


def _with_ttl(body: dict, wait: float) -> dict:
    """body with the card's lifetime: ttl, and timeout_seconds for a router
    older than ttl (which ignores ttl and caps the card at its MOBILE_PROMPT_TTL)."""
    ttl = _card_ttl(wait)
    body["ttl"] = ttl
    if ttl > 0:
        body["timeout_seconds"] = ttl
    return body


def _clarify_multi(clarify_id: str, kwargs: dict) -> bool:
    """Whether Hermes asked a multi-select clarify: the newest runner registers
    multi_select on the entry (tools.clarify_gateway) and does not pass it to
    send_clarify; an older one may pass it as a keyword."""
    if "multi_select" in kwargs:
        return bool(kwargs["multi_select"])
    try:
        from tools import clarify_gateway
        with clarify_gateway._lock:
            return bool(getattr(clarify_gateway._entries.get(clarify_id), "multi_select", False))
    except Exception:
        return False


RECOMMENDED_LABEL = "(Recommended)"  # Hermes marks the agent's first choice with it (tools.clarify_tool)


def _strip_recommended(text: str) -> str:
    """A label without Hermes's "(Recommended)" mark, as tools.clarify_tool.strip_recommended."""
    text = str(text).strip()
    if text.casefold().endswith(RECOMMENDED_LABEL.casefold()):
        return text[:-len(RECOMMENDED_LABEL)].strip()
    return text


def _label_match(text: str, choices: list) -> Optional[str]:
    """The choice text names, as Hermes matches a typed label
    (tools.clarify_gateway._label_matches): case-insensitive, ignoring the
    "(Recommended)" mark on either side; the label as Hermes shows it."""
    key = _strip_recommended(text).casefold()
    return next((str(c).strip() for c in choices if _strip_recommended(c).casefold() == key), None)


def _multi_answer(text: str, choices: list) -> Optional[str]:
    """A multi-select answer typed on the phone ("1, 3", "1 3", "berlin, rome")
    as Hermes canonicalises a typed reply (tools.clarify_gateway
    ._coerce_multi_select_text): a JSON list of every chosen label, in the
    order named, each once; None when a number is out of range or a part names
    no choice (the text then goes to Hermes as it is, as Hermes takes it after
    "other")."""
    text = text.strip()
    if not text:
        return None
    if "," in text:
        tokens = [t.strip() for t in text.split(",") if t.strip()]
    else:
        parts = text.split()
        tokens = parts if len(parts) > 1 and all(p.isdigit() for p in parts) else [text]
    picked = []
    for token in tokens:
        if token.isdigit():
            if not 1 <= int(token) <= len(choices):
                return None
            label = str(choices[int(token) - 1]).strip()
        else:
            label = _label_match(token, choices)
            if label is None:
                return None
        if label not in picked:
            picked.append(label)
    return json.dumps(picked, ensure_ascii=False) if picked else None


def _typed_answer(text: str, choices: list, multi: bool) -> str:
    """A clarify answer typed under "other", as Hermes canonicalises typed text
    after "other" (tools.clarify_gateway._coerce_text_response_detailed with
    awaiting_text): a multi-select's list of labels; a single choice's number
    or label as that choice; any other text as it is."""
    text = text.strip()
    if not choices:
        return text
    if multi:
        return _multi_answer(text, choices) or text
    try:
        number = int(text)
    except ValueError:
        number = 0
    if 1 <= number <= len(choices):
        return choices[number - 1]
    return _label_match(text, choices) or text


class MobileAdapter(BasePlatformAdapter):
    """The phones of a Hermes Mobile Gateway, reached through its router."""

    SUPPORTS_MESSAGE_EDITING = True
    MAX_MESSAGE_LENGTH = MAX_TEXT_CHARS
    # The phone shows a message as in progress until an edit marks it final:
    # the stream consumer must send the finalize edit even when the text did
    # not change.
    REQUIRES_EDIT_FINALIZE = True

    @classmethod
    def supports_exec_approval_buttons(cls) -> bool:
        """Hermes v0.21 draws its own text prompt unless the adapter says it renders cards."""
        return True

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
        self._cards: "OrderedDict[str, _Card]" = OrderedDict()  # card id → what it answers
        self._watcher: Optional[asyncio.Task] = None
        self._numeric_targets = _numeric_targets()
        # Cards being opened: an answer can arrive on the event stream before
        # the router's reply with the card's id.
        self._opening = 0
        self._opened = asyncio.Condition()
        self._binding: set = set()  # approvals whose card is being opened
        self._closed: "OrderedDict[str, str]" = OrderedDict()  # closed card id → chat_id
        # The event stream is handed over per device: one worker and queue
        # each, so a slow or failing event holds up only its own device.
        self._workers: Dict[str, asyncio.Task] = {}
        self._queues: Dict[str, asyncio.Queue] = {}
        self._inflight: list = []  # [cursor, done] of events handed out, in stream order
        self._room = asyncio.Semaphore(MAX_INFLIGHT)
        self._read_cursor = ""
        # The trace context (traceparent) of each device's latest event: the
        # answers to it carry it, so the router can continue the trace.
        self._traces: "OrderedDict[str, str]" = OrderedDict()

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
        if not self._inflight:  # else the reader goes on after the events it handed out
            self._read_cursor = self.cursor
        _chain_settles()
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_events())
        self._mark_connected()
        logger.info("[Mobile] reading events of %s after cursor %r", self.router_url, self.cursor)
        return True

    async def disconnect(self) -> None:
        self._mark_disconnected()
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        for task in self._workers.values():
            task.cancel()
        for task in list(self._workers.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._workers.clear()
        self._queues.clear()
        self._inflight.clear()
        self._room = asyncio.Semaphore(MAX_INFLIGHT)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def get_chat_info(self, chat_id: str) -> Dict[str, Any]:
        return {"name": _device_of(chat_id), "type": "dm", "chat_id": chat_id}

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
                    await self._hand_over(cursor, event)
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

    async def _hand_over(self, cursor: str, event: dict) -> None:
        """Queues an event for its device's worker. The saved cursor moves past an
        event only when it and every event before it are handled, so a restart
        neither loses nor repeats one; at most MAX_INFLIGHT wait."""
        await self._room.acquire()
        self._read_cursor = cursor
        record = [cursor, False]
        self._inflight.append(record)
        device = str(event.get("device") or "")
        if event.get("kind") == "prompt":  # a card's answer never waits behind the device's messages
            device = "prompt:" + device
        queue = self._queues.get(device)
        if queue is None:
            queue = self._queues[device] = asyncio.Queue()
            self._workers[device] = asyncio.create_task(self._work(device, queue))
        queue.put_nowait((record, event))

    async def _work(self, device: str, queue: "asyncio.Queue") -> None:
        """Hands one device's events to Hermes in order. A file the router cannot
        give now (5xx, unreachable) is tried again with backoff; any other
        failure is logged and the event skipped."""
        while True:
            if queue.empty():
                self._queues.pop(device, None)
                self._workers.pop(device, None)
                return
            record, event = queue.get_nowait()
            delay = BACKOFF_MIN
            while True:
                try:
                    await self._dispatch(event)
                    break
                except asyncio.CancelledError:
                    raise
                except (RouterError, OSError) as e:
                    if aiohttp is None or self._http is None:
                        break
                    logger.warning("[Mobile] event %s of %s: %s; retrying in %.1fs", event.get("id"), device, e, delay)
                    await asyncio.sleep(delay * (0.5 + random.random() / 2))
                    delay = min(delay * 2, BACKOFF_MAX)
                except Exception as e:
                    logger.exception("[Mobile] event %s of %s failed, skipped: %s", event.get("id"), device, e)
                    break
            record[1] = True
            self._room.release()
            self._advance()

    def _advance(self) -> None:
        cursor = None
        while self._inflight and self._inflight[0][1]:
            cursor = self._inflight.pop(0)[0]
        if cursor is not None:
            self._save_cursor(cursor)

    async def _stream(self):
        """Yields (cursor, event) from one SSE connection."""
        url = f"{self.router_url}/v1/events?format=sse&cursor={quote(self._read_cursor)}"
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

    def _note_trace(self, ev: dict) -> None:
        """Keeps the traceparent of the event for the answers to its device."""
        device, trace = str(ev.get("device") or ""), ev.get("traceparent")
        if not device or not isinstance(trace, str) or not _TRACEPARENT.match(trace):
            return
        self._traces[device] = trace
        self._traces.move_to_end(device)
        while len(self._traces) > MAX_TARGETS:
            self._traces.popitem(last=False)

    def _headers(self, chat_id: str) -> dict:
        """The headers of a call answering chat_id: the traceparent of its latest event."""
        trace = self._traces.get(_device_of(chat_id))
        return {"traceparent": trace} if trace else {}

    async def _dispatch(self, ev: dict) -> None:
        self._note_trace(ev)
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
            except (RouterError, ValueError, OSError, aiohttp.ClientError) as e:
                if isinstance(e, RouterError) and e.status != 404 or isinstance(e, (OSError, aiohttp.ClientError)):
                    raise  # the router is away: this device's worker tries again
                logger.warning("[Mobile] the file of %s cannot be had: %s", ev.get("id"), e)
                text = (text + "\n" if text else "") + "[the file was no longer available]"
        # The sender is the device the gateway authenticated (its token):
        # user_id, and so Hermes's allow-lists, name devices. What the
        # phone's hello claims (user, user_id) is a display name only.
        source = self.build_source(
            chat_id=_remember_target(device) if self._numeric_targets else device,
            chat_name=str(ev.get("user") or device),
            chat_type="dm",
            user_id=device,
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
    #
    # A card answers exactly the Hermes wait that opened it. An approval card
    # is bound to its pending approval (Hermes ≥ 0.21: its request_id, from
    # list_gateway_approvals; 0.18: the queue entry itself), never to "the
    # oldest approval of the session", which resolve_gateway_approval without
    # a request id would pick. The card lives no longer than Hermes waits
    # (timeout_seconds), and when the wait ends another way (answered with
    # /approve, timed out, interrupted, retired) the card is closed on the
    # phone; a late tap then gets prompt_done{expired} and resolves nothing.

    async def _open_card(self, card_id: str) -> Optional["_Card"]:
        """The open card card_id, once the cards being opened are (an answer or
        Hermes's call can come before the router's reply with the card's id)."""
        if card_id not in self._cards and self._opening:
            async with self._opened:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._opened.wait_for(
                        lambda: card_id in self._cards or not self._opening), REQUEST_TIMEOUT)
        return self._cards.get(card_id)

    def _remember_card(self, card_id: str, card: "_Card") -> None:
        self._cards[card_id] = card
        while len(self._cards) > MAX_OPEN_CARDS:
            old, _ = self._cards.popitem(last=False)
            logger.warning("[Mobile] forgetting card %s: more than %d are open", old, MAX_OPEN_CARDS)
        if card.kind == "exec_approval" and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.create_task(self._watch_approvals())

    async def _close_card(self, card_id: str, card: "_Card") -> None:
        """Closes a card Hermes no longer waits for (the phone shows it expired)."""
        self._forget_card(card_id, card)
        if self._http is None:
            return
        url = _session_path(self.router_url, card.chat_id, "prompts/" + quote(card_id, safe=""))
        headers = {"Authorization": "Bearer " + self.agent_token, **self._headers(card.chat_id)}
        try:
            async with self._http.delete(url, headers=headers) as resp:
                if resp.status != 404:  # 404: answered or expired meanwhile
                    await _answer(resp)
        except Exception as e:
            logger.warning("[Mobile] closing card %s failed (it expires by itself): %s", card_id, e)

    def _forget_card(self, card_id: str, card: "_Card") -> None:
        self._cards.pop(card_id, None)
        if card.binding and card.binding[0] == "request":
            _OUR_SETTLES.pop(card.binding[1], None)
        self._closed[card_id] = card.chat_id
        while len(self._closed) > MAX_OPEN_CARDS:
            self._closed.popitem(last=False)

    async def _watch_approvals(self) -> None:
        """Closes approval cards whose Hermes wait has ended, while any is open."""
        while any(c.kind == "exec_approval" for c in self._cards.values()):
            for card_id, card in list(self._cards.items()):
                try:
                    ended = card.kind == "exec_approval" and not _approval_pending(card)
                except Exception as e:  # keep watching the others; the card still expires
                    logger.warning("[Mobile] cannot tell whether card %s is still awaited: %s", card_id, e)
                    ended = False
                if ended:
                    await self._close_card(card_id, card)
            await asyncio.sleep(APPROVAL_POLL)

    async def _resolve_card(self, ev: dict) -> None:
        """Hands a card's answer (or its expiry) to Hermes's own resolvers."""
        p = ev.get("prompt") or {}
        card_id = str(p.get("id") or "")
        card = await self._open_card(card_id)
        if card is None:
            logger.info("[Mobile] answer to an unknown or closed card %s: nothing resolved", p.get("id"))
            return
        self._forget_card(card_id, card)
        option, text = str(p.get("option") or ""), str(p.get("text") or "")
        if card.options and option not in card.options:
            option = ""  # not a button the card showed: the safe answer
        if card.kind == "exec_approval" and p.get("expired"):
            _expire_approval(card)
        elif card.kind == "exec_approval":
            if not _resolve_approval(card, option or "deny"):
                logger.info("[Mobile] card %s answered after its approval ended: nothing resolved", p.get("id"))
        elif card.kind == "slash_confirm":
            from tools import slash_confirm
            answer = await slash_confirm.resolve(card.session_key, card.hermes_id, option or "cancel")
            if answer:
                await self.send(card.chat_id, answer)
        elif card.kind == "clarify":
            from tools import clarify_gateway
            choices = card.choices
            if option.startswith("c") and option[1:].isdigit() and int(option[1:]) < len(choices):
                choice = choices[int(option[1:])]
                clarify_gateway.resolve_gateway_clarify(card.hermes_id, json.dumps([choice]) if card.multi else choice)
            elif text and not p.get("expired"):
                clarify_gateway.resolve_gateway_clarify(card.hermes_id, _typed_answer(text, choices, card.multi))
            else:  # "other" without text, or expired: the next typed message answers
                clarify_gateway.mark_awaiting_text(card.hermes_id)

    async def _card(self, chat_id: str, body: dict, card: "_Card") -> SendResult:
        if self._http is None:
            return SendResult(success=False, error="Not connected", retryable=True)
        self._opening += 1
        try:
            doc = await _post(self._http, _session_path(self.router_url, chat_id, "prompts"), self.agent_token, body,
                              self._headers(chat_id))
            self._remember_card(str(doc.get("id")), card)
        except Exception as e:
            return _failed(e)
        finally:
            self._opening -= 1
            async with self._opened:
                self._opened.notify_all()
        return SendResult(success=True, message_id=str(doc.get("id")))

    async def send_exec_approval(self, chat_id: str, command: str, session_key: str,
                                 description: Optional[str] = None, metadata: Optional[dict] = None,
                                 allow_permanent: bool = True, allow_session: bool = True,
                                 smart_denied: bool = False, **kwargs) -> SendResult:
        """An exec_approval card bound to the one pending approval it shows; its
        answer resolves that approval only. When the approval cannot be told
        apart, no card is sent (Hermes then asks in text, /approve)."""
        taken = self._binding | {c.binding for c in self._cards.values() if c.kind == "exec_approval"}
        request_id = str((metadata or {}).get("approval_id") or kwargs.get("request_id") or "")
        binding = _bind_approval(session_key, command, description, taken, request_id)
        if binding is None:
            return SendResult(success=False, error="the pending approval of this card cannot be identified")
        self._binding.add(binding)  # taken while its card is being opened, too
        try:
            return await self._open_approval(chat_id, command, session_key, description, binding,
                                             allow_permanent, allow_session, smart_denied, _approval_wait(metadata))
        finally:
            self._binding.discard(binding)

    async def _open_approval(self, chat_id, command, session_key, description, binding,
                             allow_permanent, allow_session, smart_denied, wait) -> SendResult:
        options = ["once"]
        if not smart_denied and allow_session:
            options.append("session")
            if allow_permanent:
                options.append("always")
        options.append("deny")
        body = _with_ttl({"kind": "exec_approval", "text": "Run this command?", "command": command,
                          "description": _description(description), "options": options}, wait)
        res = await self._card(chat_id, body, _Card("exec_approval", session_key, "", [], chat_id, options, binding))
        if res.success and binding[0] == "request":
            self._close_when_settled(session_key, binding[1], res.message_id)
        return res

    def _close_when_settled(self, session_key: str, request_id: str, card_id: str) -> None:
        """Hermes ≥ 0.21 calls settle when the approval's wait ends by any path:
        the card closes then, without waiting for the next check."""
        from tools import approval
        register = getattr(approval, "register_gateway_settle", None)
        if register is None:
            return
        loop = asyncio.get_running_loop()

        def settle(reason=None):
            with contextlib.suppress(RuntimeError):  # the loop is gone: the gateway is stopping
                loop.call_soon_threadsafe(self._close_if_open, card_id)
        _OUR_SETTLES[request_id] = settle
        if not register(session_key, request_id, settle):
            self._close_if_open(card_id)  # it ended already

    async def retire_exec_approval_card(self, chat_id: str, message_id: str) -> None:
        """Hermes (the newest line) retires an approval card whose wait timed out,
        before it sends its notice as a message of its own: the card closes on
        the phone (a tap then resolves nothing); it is not edited."""
        card = await self._open_card(str(message_id))
        if card is not None:
            await self._close_card(str(message_id), card)

    def _close_if_open(self, card_id: str) -> None:
        card = self._cards.get(card_id)
        if card is not None:
            asyncio.ensure_future(self._close_card(card_id, card))

    async def _send_exec_approval_prompt(self, prompt) -> SendResult:
        """Hermes v0.21's approval hook: the same card, with the choices Hermes offers."""
        offered = [a[1] for a in getattr(prompt, "actions", None) or [] if len(a) > 1]
        return await self.send_exec_approval(
            prompt.chat_id, prompt.command, prompt.session_key, prompt.description,
            getattr(prompt, "metadata", None), allow_permanent="always" in offered,
            allow_session="session" in offered or not offered, smart_denied=getattr(prompt, "smart_denied", False))

    async def send_slash_confirm(self, chat_id: str, title: str, message: str, session_key: str,
                                 confirm_id: str, metadata: Optional[dict] = None, **kwargs) -> SendResult:
        """A slash_confirm card; the answer goes to tools.slash_confirm.resolve with its confirm_id."""
        text = f"{title}\n\n{message}" if title and message else (title or message or "Confirm?")
        body = _with_ttl({"kind": "slash_confirm", "text": text}, _slash_confirm_timeout())
        return await self._card(chat_id, body, _Card("slash_confirm", session_key, confirm_id, [], chat_id))

    async def send_clarify(self, chat_id: str, question: str, choices: Optional[list], clarify_id: str,
                           session_key: str, metadata: Optional[dict] = None, **kwargs) -> SendResult:
        """A clarify card (c0… and other); the answer goes to tools.clarify_gateway
        with its clarify_id. A multi-select question is answered with a JSON list of
        every choice: one button, or their numbers or names typed under "other"."""
        labels = [str(c) for c in (choices or []) if str(c)][:32]
        multi = bool(labels) and _clarify_multi(clarify_id, kwargs)
        text = question or "?"
        if multi:
            text += "\n\n(Several apply? Choose other and type their numbers, e.g. 1, 3.)"
        body = _with_ttl({"kind": "clarify", "text": text, "choices": labels}, _clarify_timeout())
        return await self._card(chat_id, body, _Card("clarify", session_key, clarify_id, labels, chat_id, multi=multi))

    async def retire_clarify_card(self, clarify_id: str, notice: Optional[str] = None) -> None:
        """Hermes (v0.21) ended a clarify wait unanswered: the card closes on the phone."""
        for card_id, card in list(self._cards.items()):
            if card.kind == "clarify" and card.hermes_id == clarify_id:
                await self._close_card(card_id, card)
                if notice:
                    await self.send(card.chat_id, notice)

    # ── sending ───────────────────────────────────────────────────────────

    async def _say(self, chat_id: str, what: str, body: dict) -> SendResult:
        if self._http is None:
            return SendResult(success=False, error="Not connected", retryable=True)
        try:
            doc = await _post(self._http, _session_path(self.router_url, chat_id, what), self.agent_token, body,
                              self._headers(chat_id))
        except Exception as e:
            return _failed(e)
        return SendResult(success=True, message_id=doc.get("id"), raw_response=doc)

    async def send(self, chat_id: str, content: str, reply_to: Optional[str] = None,
                   metadata: Optional[Dict[str, Any]] = None) -> SendResult:
        # The first part of a streamed answer (the stream consumer marks it
        # expect_edits, and not notify) is not final: edits follow, the
        # last with finalize.
        meta = metadata or {}
        final = not (meta.get("expect_edits") and not meta.get("notify"))
        return await self._say(chat_id, "messages", {"text": content[:MAX_TEXT_CHARS] or " ", "final": final})

    async def edit_message(self, chat_id: str, message_id: str, content: str, *,
                           finalize: bool = False) -> SendResult:
        """The complete new text of message_id; finalize marks the last edit. An
        edit of a card (Hermes's approval timeout notice) closes the card and
        sends the text as a message of its own."""
        card = self._cards.get(message_id)
        if card is not None or message_id in self._closed:
            if card is not None:
                await self._close_card(message_id, card)
            return await self.send(chat_id, content)
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
    device = parse_device(_device_of(chat_id or "")) or parse_device(_home_device())
    if not device:
        return {"error": f"no device to deliver to: {chat_id!r} (and MOBILE_HOME_CHANNEL is not set)"}
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


def _home_device() -> str:
    """The home device: MOBILE_HOME_CHANNEL (Hermes's <PLATFORM>_HOME_CHANNEL), or MOBILE_HOME_DEVICE."""
    return (os.getenv("MOBILE_HOME_CHANNEL") or os.getenv("MOBILE_HOME_DEVICE") or "").strip()


def env_enablement() -> Optional[dict]:
    """Enables the platform from the environment: the agent token is the minimum."""
    if not os.getenv("MOBILE_AGENT_TOKEN", "").strip():
        return None
    seed = {"router_url": os.getenv("MOBILE_ROUTER_URL", DEFAULT_ROUTER_URL).strip()}
    home = _home_device()
    if home:
        seed["home_channel"] = {"chat_id": home, "name": "Home"}
    return seed


PLATFORM_HINT = (
    "You are talking to the user's phone through the Hermes Mobile app. It renders markdown, "
    "plays voice messages and shows images, videos and documents you send; approvals and "
    "questions appear as buttons. Keep answers readable on a small screen."
)


def _entry_fields() -> Optional[set]:
    """The fields of this Hermes's PlatformEntry (register_platform passes
    unknown ones on, and the dataclass refuses them), or None when unknown."""
    try:
        import dataclasses
        from gateway.platform_registry import PlatformEntry
        return {f.name for f in dataclasses.fields(PlatformEntry)}
    except Exception:
        return None


def _missing_hermes_parts() -> list:
    """What of Hermes the plugin needs and this one lacks (the check that stands
    in for a version range): a platform registry, and an approval queue it can
    bind cards to (request ids, ≥ 0.21, or the queue itself, 0.18)."""
    missing = []
    try:
        from gateway.platform_registry import PlatformEntry  # noqa: F401
    except Exception:
        missing.append("gateway.platform_registry.PlatformEntry")
    try:
        from tools import approval
        if not (hasattr(approval, "list_gateway_approvals") or hasattr(approval, "_gateway_queues")):
            missing.append("tools.approval's gateway queue")
    except Exception:
        missing.append("tools.approval")
    return missing


def register(ctx):
    """Plugin entry point: registers the "mobile" platform."""
    missing = _missing_hermes_parts()
    if missing or not hasattr(ctx, "register_platform"):
        raise RuntimeError("the mobile plugin needs Hermes Agent 0.18.2 or later; this one lacks "
                           + ", ".join(missing or ["PluginContext.register_platform"]))
    home = os.getenv("MOBILE_HOME_DEVICE", "").strip()
    if home and not os.getenv("MOBILE_HOME_CHANNEL"):
        os.environ["MOBILE_HOME_CHANNEL"] = home  # cron reads the <PLATFORM>_HOME_CHANNEL Hermes names
    fields = dict(
        name=PLATFORM,
        label="Hermes Mobile",
        adapter_factory=lambda cfg: MobileAdapter(cfg),
        check_fn=check_requirements,
        validate_config=validate_config,
        is_connected=validate_config,  # enabled only with an agent token, not by check_fn alone
        required_env=["MOBILE_ROUTER_URL", "MOBILE_AGENT_TOKEN"],
        install_hint="needs aiohttp (apt-get install python3-aiohttp, or pip install aiohttp)",
        env_enablement_fn=env_enablement,
        cron_deliver_env_var="MOBILE_HOME_CHANNEL",
        standalone_sender_fn=standalone_send,
        parse_target_ref_fn=parse_target_ref,  # Hermes ≥ 0.21
        validate_target_ref_fn=validate_target_ref,  # Hermes ≥ 0.21
        allowed_users_env="MOBILE_ALLOWED_USERS",
        allow_all_env="MOBILE_ALLOW_ALL_USERS",
        max_message_length=MAX_TEXT_CHARS,
        emoji="📱",
        platform_hint=PLATFORM_HINT,
    )
    known = _entry_fields()
    if _numeric_targets() and parse_device(_home_device()):
        _remember_target(parse_device(_home_device()))
    if known is None:
        params = inspect.signature(ctx.register_platform).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            known = set(params)
    if known is not None:
        always = {"name", "label", "adapter_factory", "check_fn", "validate_config", "required_env", "install_hint"}
        fields = {k: v for k, v in fields.items() if k in known or k in always}
    ctx.register_platform(**fields)
