"""Protocol v1 client for the Hermes Mobile Gateway (asyncio).

Needs only the standard library and the ``websockets`` package (Debian's
python3-websockets, 10.4 or later)::

    client = Client("ws://127.0.0.1:8787/ws", token, {"id": "bot-1", "name": "Bot"})
    client.on("message", lambda m: m["final"] and print(m["text"]))
    await client.connect()
    await client.send_text("hello")

It behaves as the TypeScript SDK does (docs/clients.md): hello on every
connection, reconnect with full-jitter backoff that honours the edge's
Retry-After (an upgrade refused with 503 or 429), resend of the texts, voice
notes and files the gateway has not taken, under the same ids; files split
into parts; chunked answers and files assembled by id and acked; cards,
typing, avatar, ping; errors typed by the spec's codes.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import os
import random as _random
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Optional, Tuple, Union

import websockets
import websockets.exceptions

from .backoff import MAX_RETRY_AFTER, parse_retry_after, retry_delay

__version__ = "1.0.0"

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_TEXT_CHARS = 12000
MAX_AUDIO_BYTES = 8 * 1024 * 1024
MAX_MEDIA_BYTES = 8 * 1024 * 1024
MEDIA_CHUNK_BYTES = 3 * 1024 * 1024
MIN_MEDIA_CHUNK_BYTES = 4096
MAX_MEDIA_PARTS = 2048
MAX_ID_CHARS = 128
MAX_PUSH_TOKEN_BYTES = 4096  # a push frame's token: the gateway's extension

AVATAR_STATES = ("idle", "thinking", "speaking")
MEDIA_KINDS_IN = ("image", "video", "document", "audio")
AUDIO_FORMATS = ("wav", "ogg")
PUSH_KINDS = ("fcm", "apns")


class HermesError(Exception):
    """An error from the gateway, or found before sending (local=True)."""

    def __init__(self, code: str, message: str, fatal: bool = False, local: bool = False, id: Optional[str] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fatal = fatal
        self.local = local
        self.id = id  # the text, file, card answer or delivery that failed, when the client can tell

    @property
    def permanent(self) -> bool:
        """auth_failed and forbidden: retrying as is cannot help."""
        return self.code in ("auth_failed", "forbidden")


def _local(code: str, message: str) -> HermesError:
    return HermesError(code, message, local=True)


def _refusal(e: BaseException) -> Optional[Tuple[int, Optional[float]]]:
    """The HTTP status and Retry-After (seconds) of an upgrade the server
    refused: websockets raises InvalidStatus (its response has them; 14 and
    later) or InvalidStatusCode (status_code and headers; the legacy client
    of 10.x to 13.x). None for any other failure."""
    response = getattr(e, "response", None)
    if isinstance(e, getattr(websockets.exceptions, "InvalidStatus", ())) and response is not None:
        status, headers = getattr(response, "status_code", None), getattr(response, "headers", None)
    elif isinstance(e, getattr(websockets.exceptions, "InvalidStatusCode", ())):
        status, headers = getattr(e, "status_code", None), getattr(e, "headers", None)
    else:
        return None
    if not isinstance(status, int):
        return None
    values: List[str] = []
    if headers is not None:
        try:
            values = list(headers.get_all("Retry-After"))
        except AttributeError:  # a plain mapping
            v = headers.get("Retry-After")
            values = [v] if v is not None else []
    return status, parse_retry_after(values)


def new_id(prefix: str = "") -> str:
    return prefix + os.urandom(12).hex()


def media_frames(data: bytes, kind: str, id: str, mime: str = "", filename: str = "", caption: str = "",
                 chunk_bytes: int = MEDIA_CHUNK_BYTES, max_bytes: int = MAX_MEDIA_BYTES) -> List[dict]:
    """The media frames of one file, with the protocol's limits checked."""
    if kind not in MEDIA_KINDS_IN:
        raise _local("unsupported_frame", f"media kind {kind}")
    if not data:
        raise _local("bad_frame", "empty file")
    if len(data) > max_bytes:
        raise _local("too_big", f"file of {len(data)} bytes; at most {max_bytes}")
    if caption and len(caption) > MAX_TEXT_CHARS:
        raise _local("too_big", f"caption over {MAX_TEXT_CHARS} characters")
    if not MIN_MEDIA_CHUNK_BYTES <= chunk_bytes <= MEDIA_CHUNK_BYTES:
        raise _local("bad_frame", f"chunk_bytes {chunk_bytes}: between {MIN_MEDIA_CHUNK_BYTES} and {MEDIA_CHUNK_BYTES}")
    parts = -(-len(data) // chunk_bytes)
    if parts > MAX_MEDIA_PARTS:
        raise _local("too_big", f"{parts} parts; at most {MAX_MEDIA_PARTS}")
    frames = []
    for i in range(parts):
        f = {"t": "media", "id": id, "kind": kind, "part": i, "parts": parts,
             "data": base64.b64encode(data[i * chunk_bytes:(i + 1) * chunk_bytes]).decode()}
        if mime:
            f["mime"] = mime
        if filename:
            f["filename"] = filename
        if caption:
            f["caption"] = caption
        frames.append(f)
    return frames


class _Outgoing:
    __slots__ = ("id", "frames", "seq", "sends")

    def __init__(self, id: str, frames: List[dict]):
        self.id, self.frames, self.seq, self.sends = id, frames, 0, 0


class Client:
    """One device's connection, kept up across drops.

    Events (``on(name, fn)``; fn may be a coroutine function): ready, state,
    message ({id, text, final, edit}: the whole text so far), media ({id,
    kind, mime, filename, caption, size, data: bytes | None, url,
    reply_to}), media_progress, prompt, prompt_done, avatar, typing (bool),
    delivered, push ({kind, registered}: the gateway stored or took back
    the app's push token), error (HermesError), frame (every frame received), sent
    (every frame written), acknowledged (the id of a text or file the
    gateway has taken), disconnected ({code, reason, reconnect}), retry
    ({attempt, delay, status, retry_after, reason}: the client waits delay
    seconds before its next connection attempt; status and retry_after are
    those of an upgrade the edge refused, else None).

    Reconnecting: the pause is drawn from [0, min(max_delay, min_delay *
    2**attempt)] (full jitter); after an upgrade refused with 503 or 429 and
    a Retry-After, it is Retry-After plus that draw; never more than
    max_retry_after (5 minutes). The count of attempts starts again once a
    connection has been ready for stable_after seconds. random (in [0, 1)),
    sleep and clock (monotonic seconds) can be given for tests.

    Handlers run one after another in a task of their own, in the order of
    the events, never in the receive loop: a slow handler delays the next
    handlers, not the connection's pongs.

    token is the app token, a device's token, or an owner's app or device
    key (hmt_<owner>.<key id>.<secret>), sent as it is in hello.
    """

    def __init__(self, url: str, token: str, device: Dict[str, str], user: Optional[Dict[str, str]] = None, *,
                 reconnect: bool = True, min_delay: float = 0.5, max_delay: float = 30.0,
                 ping_interval: float = 25.0, pong_timeout: float = 15.0, auto_ack: bool = True,
                 typing_idle: float = 6.0, connect_timeout: float = 10.0, ready_timeout: float = 10.0,
                 max_resends: int = 8,
                 get_token: Optional[Callable[[], Union[str, Awaitable[str]]]] = None,
                 logger: Optional[logging.Logger] = None,
                 max_retry_after: float = MAX_RETRY_AFTER, stable_after: float = 10.0,
                 random: Optional[Callable[[], float]] = None,
                 sleep: Optional[Callable[[float], Awaitable[Any]]] = None,
                 clock: Optional[Callable[[], float]] = None):
        self.url, self.token, self.user = url, token, user
        self.device = dict(device or {})
        if not self.device.get("id"):
            self.device["id"] = "dev-" + new_id()[:12]
        self.reconnect, self.min_delay, self.max_delay = reconnect, min_delay, max_delay
        self.ping_interval, self.pong_timeout, self.auto_ack = ping_interval, pong_timeout, auto_ack
        self.typing_idle, self.connect_timeout, self.ready_timeout = typing_idle, connect_timeout, ready_timeout
        self.max_resends = max_resends
        self.max_retry_after, self.stable_after = max_retry_after, stable_after
        self._random = random or _random.random
        self._sleep = sleep or asyncio.sleep
        self._clock = clock or time.monotonic
        self._wake: Optional[asyncio.Event] = None  # set by close(): ends the pause before a reconnect
        self.get_token = get_token
        self.log = logger or logging.getLogger("hermes_client")
        self._iterators: List[asyncio.Queue] = []  # of events(); None in one ends it
        self.ready: Optional[dict] = None
        self.state = "closed"
        self.avatar = "idle"
        self.typing = False
        self._handlers: Dict[str, list] = {}
        self._outbox: Dict[str, _Outgoing] = {}
        self._seq = 0
        self._pings: Dict[int, tuple] = {}
        self._last_ts = 0
        self._transient = False
        self._messages: Dict[str, str] = {}
        self._incoming: Dict[str, dict] = {}
        self._ws = None
        self._task: Optional[asyncio.Task] = None
        self._stopped = True
        self._first: Optional[asyncio.Future] = None
        self._wlock = asyncio.Lock()
        self._keepalive: Optional[asyncio.Task] = None
        self._events: Optional[asyncio.Queue] = None
        self._dispatcher: Optional[asyncio.Task] = None
        self._typing_timer: Optional[asyncio.TimerHandle] = None
        self._resend: Optional[asyncio.Task] = None
        self._offline: List[dict] = []  # card answers and deliveries written after the next ready
        self._writes = 0
        self._unconfirmed: List[tuple] = []  # (id, write number) since the last pong, for errors
        self._pushes: List[Tuple[str, asyncio.Future]] = []  # push frames written and not answered, in order

    # Events.

    def on(self, name: str, fn: Callable[[Any], Any]) -> Callable[[], None]:
        self._handlers.setdefault(name, []).append(fn)
        return lambda: self._handlers[name].remove(fn) if fn in self._handlers[name] else None

    def once(self, name: str, fn: Callable[[Any], Any]) -> Callable[[], None]:
        """Like on(), for the first event only."""
        def first(v):
            off()
            return fn(v)
        off = self.on(name, first)
        return off

    def off(self, name: str, fn: Callable[[Any], Any]) -> None:
        """Removes a handler given to on()."""
        if fn in self._handlers.get(name, ()):
            self._handlers[name].remove(fn)

    async def events(self, names: Optional[Iterable[str]] = None) -> AsyncIterator[Tuple[str, Any]]:
        """The events of the given names (all when None) as (name, value), in
        order, queued until read, until the client stops; ``break`` or
        cancelling the task leaves it::

            async for name, value in client.events(["message", "error"]):
                ...
        """
        want = set(names) if names is not None else None
        q: asyncio.Queue = asyncio.Queue()
        self._iterators.append(q)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if want is None or item[0] in want:
                    yield item
        finally:
            self._iterators.remove(q)

    def _end_iterators(self) -> None:
        for q in self._iterators:
            q.put_nowait(None)

    async def _emit(self, name: str, value: Any) -> None:
        for q in self._iterators:
            q.put_nowait((name, value))
        self._queue((name, value))

    def _queue(self, item: tuple) -> None:
        if self._events is None:
            self._events = asyncio.Queue()
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        self._events.put_nowait(item)

    def _after_handlers(self, fn: Callable[[], Awaitable[Any]]) -> None:
        """Runs fn once the handlers of the events so far have run."""
        self._queue((None, fn))

    async def _dispatch(self) -> None:
        assert self._events is not None
        while True:
            name, value = await self._events.get()
            try:
                if name is None:
                    await value()
                    continue
                for fn in list(self._handlers.get(name, ())):
                    try:
                        r = fn(value)
                        if inspect.isawaitable(r):
                            await r
                    except Exception:  # an app's handler must not kill the connection
                        self.log.exception("a %s handler raised", name)
            except Exception:
                self.log.exception("after the handlers")
            finally:
                self._events.task_done()

    async def wait_for(self, name: str, pred: Callable[[Any], bool] = lambda v: True, timeout: float = 10.0) -> Any:
        """The next value of event name that pred accepts."""
        fut = asyncio.get_running_loop().create_future()

        def fn(v):
            if not fut.done() and pred(v):
                fut.set_result(v)

        off = self.on(name, fn)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            off()

    @property
    def capabilities(self) -> Optional[dict]:
        return self.ready and self.ready.get("capabilities")

    @property
    def pending(self) -> List[str]:
        """Ids of texts and files not yet confirmed taken."""
        return list(self._outbox)

    # Connection.

    async def connect(self) -> dict:
        """Connects; returns the first ready frame. Raises HermesError on
        auth_failed/forbidden (no reconnect then), and connect_failed when
        the first connection fails. An upgrade the edge refuses with 503 or
        429 (it sheds load) is not a failure: the client waits as it would to
        reconnect (Retry-After plus jitter), tries again, and returns at the
        later ready."""
        if not self._stopped:
            raise _local("bad_frame", "already connected")
        self._stopped = False
        self._wake = asyncio.Event()
        self._first = asyncio.get_running_loop().create_future()
        self.log.info("connecting to %s", self.url)
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            return await asyncio.shield(self._first)
        except asyncio.CancelledError:
            # Cancelling connect() (task.cancel(), asyncio.wait_for) closes the client.
            first = self._first
            await self.close()
            if first is not None and first.done():
                first.exception()  # retrieved: nobody awaits it now
            raise
        except HermesError:
            # A failed first connection (auth_failed, connect_failed): the
            # connection task and the handlers end before the error is
            # raised, so a script whose asyncio.run ends on it leaves no
            # task pending on a closed loop.
            await self.close()
            raise

    async def close(self) -> None:
        """Closes and stops reconnecting; what is pending stays for the next
        connect(). Returns once the handlers of the events so far have run
        (unless called from one)."""
        self._stopped = True
        self._fail_first(_local("internal_error", "closed"))
        self._end_iterators()
        if self._wake is not None:
            self._wake.set()
        ws = self._ws
        if ws is not None:
            await ws.close()
        if self._task is not None and self._task is not asyncio.current_task():
            try:
                await asyncio.wait_for(self._task, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        await self._set_state("closed")
        d = self._dispatcher
        if self._events is not None and d is not None and d is not asyncio.current_task():
            try:
                await asyncio.wait_for(self._events.join(), 5)
            except asyncio.TimeoutError:
                return  # a handler still runs: leave it be
            # The handlers have run: end the dispatcher (the next event
            # starts another), so a closed client holds no task.
            if self._dispatcher is d:
                self._dispatcher = None
            d.cancel()
            await asyncio.wait({d})

    def drop(self) -> None:
        """Drops the socket as a lost network would; the client reconnects."""
        ws, self._ws = self._ws, None  # nothing more is written to it
        if ws is not None:
            ws.transport.abort()

    def _fail_first(self, err: Exception) -> None:
        if self._first is not None and not self._first.done():
            self._first.set_exception(err)

    async def _set_state(self, s: str) -> None:
        if self.state != s:
            self.state = s
            await self._emit("state", s)

    async def _run(self) -> None:
        attempt = 0
        while not self._stopped:
            await self._set_state("connecting")
            code, reason, failure, ready = 1006, "", "", False
            ready_at = 0.0
            refusal: Optional[Tuple[int, Optional[float]]] = None  # (status, Retry-After) of a refused upgrade
            timer = None
            try:
                async with websockets.connect(self.url, max_size=MAX_FRAME_BYTES + 4096, ping_interval=None,
                                              compression=None, open_timeout=self.connect_timeout,
                                              close_timeout=min(self.connect_timeout, 2.0)) as ws:
                    self._ws = ws

                    def no_ready():
                        nonlocal failure
                        failure = f"no ready within {self.ready_timeout} s"
                        ws.transport.abort()

                    timer = asyncio.get_running_loop().call_later(self.ready_timeout, no_ready)
                    token = self.token
                    if self.get_token is not None:
                        token = self.get_token()
                        if inspect.isawaitable(token):
                            token = await token
                    hello = {"t": "hello", "token": token, "device": self.device}
                    if self.user:
                        hello["user"] = self.user
                    await self._write(hello)
                    try:
                        async for raw in ws:
                            if isinstance(raw, bytes):
                                raw = raw.decode("utf-8", "replace")
                            try:
                                f = json.loads(raw)
                            except ValueError:
                                continue
                            if isinstance(f, dict) and isinstance(f.get("t"), str):
                                if f["t"] == "ready":
                                    ready, ready_at = True, self._clock()
                                    timer.cancel()
                                await self._handle(f)
                    finally:
                        code, reason = ws.close_code or 1006, ws.close_reason or ""
            except asyncio.TimeoutError:
                failure = failure or f"no connection within {self.connect_timeout} s"
            except Exception as e:  # OSError, WebSocketException, a get_token that raised
                refusal = _refusal(e)
                if refusal is not None:
                    ra = refusal[1]
                    failure = f"upgrade refused with HTTP {refusal[0]}" + (f", Retry-After {ra:g} s" if ra is not None else "")
                else:
                    failure = failure or f"cannot connect to {self.url}: {e}"
            finally:
                if timer is not None:
                    timer.cancel()
                self._detach()
            if ready and self._clock() - ready_at >= self.stable_after:
                attempt = 0  # up long enough: the backoff starts again
            # The edge shed this attempt before the upgrade: it is there, and says come back later.
            shed = self.reconnect and refusal is not None and refusal[0] in (503, 429)
            if code == 1008 and reason in ("auth_failed", "forbidden"):
                self._stop(HermesError(reason, "connection refused", fatal=True))
            elif not ready and not shed and self._first is not None and not self._first.done():
                # The first connection of connect() failed: say so rather than retry unseen.
                err = _local("connect_failed", failure or f"closed with {code} {reason}".strip())
                await self._emit("error", err)
                self._stop(err)
            elif code == 1000 and not self._stopped:
                # The gateway closes with 1000 only when a newer connection of
                # this device took over: reconnecting would take it back, and so on.
                self._stop(_local("internal_error", "replaced by a newer connection"))
            elif not self.reconnect and not self._stopped:
                self._stop(_local("internal_error", "connection lost"))
            self.log.log(logging.INFO if self._stopped else logging.WARNING, "socket closed (%s %s%s), %s", code, reason,
                         ": " + failure if failure else "", "stopped" if self._stopped else "reconnecting")
            if ready or self._stopped:
                await self._emit("disconnected", {"code": code, "reason": reason or failure,
                                                  "reconnect": not self._stopped})
            if self._stopped:
                break
            ra = refusal[1] if shed and refusal is not None else None
            delay = retry_delay(attempt, self.min_delay, self.max_delay, self._random, floor=ra,
                                max_delay=self.max_retry_after)
            await self._emit("retry", {"attempt": attempt, "delay": delay, "status": refusal[0] if refusal else None,
                                       "retry_after": ra, "reason": failure or f"closed with {code} {reason}".strip()})
            attempt += 1
            await self._pause(delay)
        await self._set_state("closed")

    async def _pause(self, delay: float) -> None:
        """Sleeps delay seconds, or until close()."""
        if self._stopped:
            return
        assert self._wake is not None
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, waker):
                t.cancel()

    def _stop(self, err: HermesError) -> None:
        self._stopped = True
        self._fail_first(err)
        self._end_iterators()

    def _detach(self) -> None:
        self._ws = None
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        for fut, *_ in self._pings.values():
            if not fut.done():
                fut.set_exception(_local("internal_error", "connection closed before pong"))
        self._pings.clear()
        for _, fut in self._pushes:
            if not fut.done():
                fut.set_exception(_local("internal_error", "connection closed before the push frame was answered; "
                                                           "register again after the next ready"))
        self._pushes.clear()
        for o in self._outbox.values():
            o.seq = 0
        self._incoming.clear()
        self._unconfirmed.clear()
        self._writes = 0
        if self._resend is not None:
            self._resend.cancel()
            self._resend = None

    async def _write(self, f: dict) -> bool:
        ws = self._ws
        if ws is None:
            return False
        async with self._wlock:
            try:
                await ws.send(json.dumps(f, ensure_ascii=False))
            except websockets.WebSocketException:
                return False
            self._writes += 1
            t = f["t"]
            fid = f.get("prompt_id") if t == "prompt" else f.get("id") if t in ("text", "audio", "deliver") or (
                t == "media" and not f.get("part")) else None
            if fid:
                self._unconfirmed.append((fid, self._writes))
        await self._emit("sent", f)
        return True

    # Receiving.

    async def _handle(self, f: dict) -> None:
        await self._emit("frame", f)
        t = f["t"]
        if t == "ready":
            self.ready = f
            await self._set_state("open")
            await self._emit("ready", f)
            if self._first is not None and not self._first.done():
                self._first.set_result(f)
            await self._flush()
            queued, self._offline = self._offline, []
            for q in queued:
                if not await self._write(q):
                    self._offline.append(q)
            if self.ping_interval > 0:
                self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())
        elif t == "message":
            await self._on_message(f)
        elif t == "media":
            await self._on_media(f)
        elif t == "prompt":
            await self._emit("prompt", f)
        elif t == "prompt_done":
            await self._emit("prompt_done", f)
        elif t == "avatar":
            self.avatar = f.get("state") if f.get("state") in AVATAR_STATES else "idle"
            await self._emit("avatar", self.avatar)
        elif t == "typing":
            await self._set_typing(not f.get("stop"))
        elif t == "pong":
            await self._on_pong(f.get("ts"))
        elif t == "delivered":
            await self._emit("delivered", {"id": f.get("id"), "device": f.get("device")})
        elif t == "push":
            for i, (kind, fut) in enumerate(self._pushes):
                if kind == f.get("kind"):
                    del self._pushes[i]
                    if not fut.done():
                        fut.set_result(None)
                    break
            await self._emit("push", {"kind": f.get("kind"), "registered": bool(f.get("registered"))})
        elif t == "error" and self._pushes and not f.get("fatal") and str(f.get("message", "")).startswith("push"):
            # An error to a push frame says so first: it fails the oldest
            # unanswered registration, and no text or file.
            _, fut = self._pushes.pop(0)
            err = HermesError(str(f.get("code")), str(f.get("message", "")))
            if not fut.done():
                fut.set_exception(err)
            await self._emit("error", err)
        elif t == "error":
            # Error frames carry no id; the gateway answers a socket's frames
            # in order, so when one frame with an id is unconfirmed, it is the one.
            ids = {i for i, _ in self._unconfirmed}
            err = HermesError(str(f.get("code")), str(f.get("message", "")), fatal=bool(f.get("fatal")),
                              id=ids.pop() if len(ids) == 1 else None)
            if err.code == "internal_error":
                self._transient = True
            if err.fatal and err.permanent:
                self._stop(err)
            await self._emit("error", err)
        # Unknown frame types are ignored, as the protocol asks.

    async def _set_typing(self, on: bool) -> None:
        if self._typing_timer is not None:
            self._typing_timer.cancel()
            self._typing_timer = None
        if on:
            loop = asyncio.get_running_loop()
            self._typing_timer = loop.call_later(self.typing_idle, lambda: loop.create_task(self._set_typing(False)))
        if self.typing != on:
            self.typing = on
            await self._emit("typing", on)

    async def _on_message(self, f: dict) -> None:
        mid = str(f.get("id", ""))
        index = (f.get("chunk") or {}).get("index", 0)
        text = f.get("text") or ""
        if index:
            text = self._messages.get(mid, "") + text
        final = bool(f.get("final"))
        if final:
            self._messages.pop(mid, None)
        else:
            self._messages[mid] = text
        await self._emit("message", {"id": mid, "text": text, "final": final, "edit": bool(f.get("edit"))})
        if final:
            await self._set_typing(False)
            self._after_handlers(lambda: self.ack(mid))

    async def _on_media(self, f: dict) -> None:
        mid = str(f.get("id", ""))
        parts = max(1, int(f.get("parts") or 1))
        part = int(f.get("part") or 0)
        if parts > MAX_MEDIA_PARTS or not 0 <= part < parts or int(f.get("size") or 0) > MAX_MEDIA_BYTES:
            self._incoming.pop(mid, None)
            await self._emit("error", _local("too_big", f"incoming file {mid}: part {part} of {parts} is past the limits"))
            return
        inc = self._incoming.get(mid)
        if inc is None or part == 0:
            inc = {"meta": f, "parts": [None] * parts, "got": 0}
            self._incoming[mid] = inc
        if f.get("data") is not None and inc["parts"][part] is None:
            inc["parts"][part] = base64.b64decode(f["data"])
            inc["got"] += 1
        await self._emit("media_progress", {"id": mid, "part": part, "parts": parts})
        if not f.get("final") and inc["got"] < parts:
            return
        del self._incoming[mid]
        if 0 < inc["got"] < parts:
            # The last part came without some earlier ones: not a file to hand over, nor to ack.
            await self._emit("error", HermesError("bad_frame", f"incoming file {mid}: {inc['got']} of {parts} parts",
                                                  local=True, id=mid))
            return
        m = inc["meta"]
        file = {"id": mid, "kind": m.get("kind"), "mime": m.get("mime"), "filename": m.get("filename"),
                "caption": m.get("caption"), "size": m.get("size"), "reply_to": m.get("reply_to"),
                "url": f.get("url") or m.get("url"),
                "data": b"".join(p for p in inc["parts"] if p) if inc["got"] else None}
        await self._emit("media", file)
        self._after_handlers(lambda: self.ack(mid))

    async def ack(self, id: str, force: bool = False) -> None:
        """Sends ack{id}; done for you unless auto_ack is False."""
        if self.auto_ack or force:
            await self._write({"t": "ack", "id": id})

    # Sending.

    def _check_id(self, id: Optional[str]) -> str:
        v = id or new_id("c-")
        if len(v) > MAX_ID_CHARS:
            raise _local("bad_frame", f"id longer than {MAX_ID_CHARS} characters")
        return v

    async def _enqueue(self, id: str, frames: List[dict]) -> str:
        self._outbox[id] = _Outgoing(id, frames)
        if self.state == "open":
            await self._flush()
        return id

    async def _flush(self) -> None:
        wrote = False
        for o in list(self._outbox.values()):
            if o.seq:
                continue
            for f in o.frames:
                if not await self._write(f):
                    return
            self._seq += 1
            o.seq = self._seq
            wrote = True
        if wrote:
            asyncio.get_running_loop().create_task(self._quiet_ping())

    async def _quiet_ping(self) -> None:
        try:
            await self.ping()
        except HermesError:
            pass

    async def _retry_flush(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.state == "open":
            await self._flush()

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.ping_interval)
            await self._quiet_ping()

    async def _on_pong(self, ts: Any) -> None:
        entry = self._pings.pop(ts, None) if isinstance(ts, int) else None
        if entry is None:
            return
        fut, sent_at, mark, writes = entry
        self._unconfirmed = [u for u in self._unconfirmed if u[1] > writes]
        retry, self._transient = self._transient, False
        sends = 0
        for id, o in list(self._outbox.items()):
            if not o.seq or o.seq > mark:
                continue
            if not retry:
                del self._outbox[id]
                await self._emit("acknowledged", id)
                continue
            o.sends += 1
            if o.sends > self.max_resends:
                del self._outbox[id]
                await self._emit("error", HermesError("internal_error",
                                                      f"{id}: given up after {o.sends} sends met internal_error", id=id))
            else:
                o.seq = 0  # written, but something failed on the way: send again, same id, after a growing pause
                sends = max(sends, o.sends)
        if sends:
            if self._resend is not None:
                self._resend.cancel()
            cap = min(self.max_delay, self.min_delay * 2 ** (sends - 1))
            self._resend = asyncio.get_running_loop().create_task(self._retry_flush(cap / 2 + self._random() * cap / 2))
        if not fut.done():
            fut.set_result(time.monotonic() - sent_at)

    async def ping(self) -> float:
        """Round-trip time in seconds."""
        ts = self._last_ts = max(self._last_ts + 1, int(time.time() * 1000))
        fut = asyncio.get_running_loop().create_future()
        self._pings[ts] = (fut, time.monotonic(), self._seq, self._writes)
        if not await self._write({"t": "ping", "ts": ts}):
            self._pings.pop(ts, None)
            raise _local("internal_error", "not connected")
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.pong_timeout)
        except asyncio.TimeoutError:
            self._pings.pop(ts, None)
            self.drop()
            raise _local("internal_error", "no pong in time")

    async def send_text(self, text: str, id: Optional[str] = None) -> str:
        if not isinstance(text, str) or not text.strip():
            raise _local("bad_frame", "empty text")
        limit = (self.capabilities or {}).get("max_text_chars", MAX_TEXT_CHARS)
        if len(text) > limit:
            raise _local("too_big", f"text of {len(text)} characters; at most {limit}")
        mid = self._check_id(id)
        return await self._enqueue(mid, [{"t": "text", "id": mid, "text": text}])

    async def send_voice(self, data: bytes, format: str, text: str = "", id: Optional[str] = None) -> str:
        if format not in AUDIO_FORMATS:
            raise _local("unsupported_frame", f"audio format {format}: wav or ogg")
        if not data:
            raise _local("bad_frame", "empty recording")
        if len(data) > MAX_AUDIO_BYTES:
            raise _local("too_big", f"recording of {len(data)} bytes; at most {MAX_AUDIO_BYTES}")
        if text and len(text) > MAX_TEXT_CHARS:
            raise _local("too_big", f"text over {MAX_TEXT_CHARS} characters")
        mid = self._check_id(id)
        f = {"t": "audio", "id": mid, "format": format, "data": base64.b64encode(data).decode()}
        if text:
            f["text"] = text
        return await self._enqueue(mid, [f])

    async def send_file(self, data: bytes, kind: str, mime: str = "", filename: str = "", caption: str = "",
                        id: Optional[str] = None, chunk_bytes: int = MEDIA_CHUNK_BYTES) -> str:
        mid = self._check_id(id)
        limit = (self.capabilities or {}).get("max_media_bytes", MAX_MEDIA_BYTES)
        frames = media_frames(data, kind, mid, mime, filename, caption, chunk_bytes, limit)
        return await self._enqueue(mid, frames)

    async def answer(self, prompt_id: str, option_id: str = "", text: str = "") -> None:
        if not prompt_id:
            raise _local("bad_frame", "prompt_id is required")
        if not option_id and not text:
            raise _local("bad_frame", "an option_id or a text is required")
        f = {"t": "prompt", "prompt_id": prompt_id}
        if option_id:
            f["option_id"] = option_id
        if text:
            f["text"] = text
        await self._write_or_queue(f)

    async def _write_or_queue(self, f: dict) -> None:
        """Writes f now, or after the next ready when not connected (card answers and deliveries)."""
        if self.state != "open" or not await self._write(f):
            self._offline.append(f)

    async def send_typing(self) -> None:
        await self._write({"t": "typing"})

    async def register_push(self, kind: str, token: str) -> None:
        """Registers the app's push token for this device, so that the gateway
        wakes the app while it holds no socket: kind "fcm" with the
        registration token Firebase Cloud Messaging gave the app, "apns" with
        the APNs device token in hex (the gateway's extension of Protocol v1,
        docs/protocol-notes.md). Returns once the gateway stored it; call it
        after every connect() and whenever the platform hands out a new token
        (a registration lasts 30 days). An empty token takes it back
        (remove_push). Raises, without sending, unsupported_frame when the
        gateway does not offer kind (ready's capabilities.push: an older
        gateway offers none) and internal_error when not connected; else the
        gateway's error: bad_frame (a token that cannot be one),
        internal_error (send it again)."""
        if self.state != "open":
            raise _local("internal_error", "not connected: register the push token after ready")
        offered = (self.capabilities or {}).get("push") or []
        if kind not in offered:
            raise _local("unsupported_frame",
                         f"the gateway sends no {kind} notifications (capabilities.push: {', '.join(offered) or 'none'})")
        if len(token) > MAX_PUSH_TOKEN_BYTES or any(not ("!" <= ch <= "~") for ch in token):
            raise _local("bad_frame", f"a push token is printable ASCII without spaces, at most {MAX_PUSH_TOKEN_BYTES} bytes")
        fut = asyncio.get_running_loop().create_future()
        entry = (kind, fut)
        self._pushes.append(entry)
        if not await self._write({"t": "push", "kind": kind, "token": token}):
            if entry in self._pushes:
                self._pushes.remove(entry)
            raise _local("internal_error", "not connected")
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.pong_timeout)
        except asyncio.TimeoutError:
            if entry in self._pushes:
                self._pushes.remove(entry)
            raise _local("internal_error", "the push frame was not answered in time; register again")

    async def remove_push(self, kind: str) -> None:
        """Takes back the app's push token of kind: the gateway stops waking this device through that service."""
        await self.register_push(kind, "")

    async def deliver(self, target: str = "", text: str = "", media: Optional[dict] = None, id: Optional[str] = None) -> str:
        """Service delivery: only from loopback or with a deliver token."""
        if not text and not media:
            raise _local("bad_frame", "deliver needs a text or a media")
        mid = self._check_id(id)
        f: Dict[str, Any] = {"t": "deliver", "id": mid}
        if target:
            f["target"] = target
        if text:
            f["text"] = text
        if media:
            f["media"] = media
        await self._write_or_queue(f)
        return mid
