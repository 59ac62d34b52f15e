"""hermes_client against a real gateway (services/edge, demo agent)."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import websockets

import pytest

from hermes_client import (MAX_AUDIO_BYTES, MAX_MEDIA_BYTES, MAX_MEDIA_PARTS, MAX_TEXT_CHARS, MEDIA_CHUNK_BYTES,
                           MIN_MEDIA_CHUNK_BYTES, Client, HermesError, media_frames)


def uniq(p):
    return p + "-" + os.urandom(4).hex()


def client(gw, device, **kw):
    token = kw.pop("token", gw.token)
    return Client(gw.ws, token, {"id": device, "name": device, "platform": "pytest"}, min_delay=0.05, max_delay=0.5, **kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_ready(gateway):
    async def go():
        dev = uniq("py-ready")
        c = client(gateway, dev)
        ready = await c.connect()
        try:
            assert ready["v"] == 1
            assert ready["session"] == "mobile:" + dev
            assert ready["avatar_url"] == gateway.http + "/avatar/"
            assert c.capabilities["max_text_chars"] == MAX_TEXT_CHARS
            assert c.capabilities["avatar_states"] == ["idle", "thinking", "speaking"]
            assert c.state == "open"
        finally:
            await c.close()
    run(go())


def test_streamed_answer_acked(gateway):
    async def go():
        c = client(gateway, uniq("py-text"))
        await c.connect()
        seen, acks, avatars = [], [], []
        c.on("message", seen.append)
        c.on("sent", lambda f: f["t"] == "ack" and acks.append(f["id"]))
        c.on("avatar", avatars.append)
        taken = asyncio.ensure_future(c.wait_for("acknowledged"))
        final = asyncio.ensure_future(c.wait_for("message", lambda m: m["final"]))
        mid = await c.send_text("hello there")
        final = await final
        assert final["text"] == "You said: hello there"
        assert seen[0]["text"] == "You said: "
        assert any(m["edit"] and not m["final"] and len(seen[0]["text"]) < len(m["text"]) < len(final["text"]) for m in seen)
        assert acks == [final["id"]]
        assert await taken == mid
        assert c.pending == []
        assert "thinking" in avatars
        await c.close()
    run(go())


def test_long_answer_in_chunks(gateway):
    async def go():
        c = client(gateway, uniq("py-long"))
        await c.connect()
        chunks = []
        c.on("frame", lambda f: f["t"] == "message" and chunks.append(f))
        text = "0123456789" * 1200
        final = asyncio.ensure_future(c.wait_for("message", lambda m: m["final"]))
        await c.send_text(text)
        assert (await final)["text"] == "You said: " + text
        assert any(f["chunk"]["total"] > 1 and f["chunk"]["index"] > 0 for f in chunks)
        await c.close()
    run(go())


def test_limits_at_the_boundary(gateway):
    async def go():
        c = client(gateway, uniq("py-limits"))

        async def err(coro, code):
            with pytest.raises(HermesError) as e:
                await coro
            assert e.value.code == code and e.value.local

        await err(c.send_text("x" * (MAX_TEXT_CHARS + 1)), "too_big")
        await err(c.send_text("  "), "bad_frame")
        await c.send_text("😀" * MAX_TEXT_CHARS)
        await err(c.send_voice(bytes(MAX_AUDIO_BYTES + 1), "wav"), "too_big")
        await err(c.send_voice(b"x", "mp3"), "unsupported_frame")
        await c.send_voice(bytes(MAX_AUDIO_BYTES), "ogg")
        await err(c.send_file(bytes(MAX_MEDIA_BYTES + 1), "document"), "too_big")
        await err(c.send_file(b"x", "sticker"), "unsupported_frame")
        await err(c.send_file(b"x", "document", chunk_bytes=MIN_MEDIA_CHUNK_BYTES - 1), "bad_frame")
        await err(c.send_file(b"x", "document", chunk_bytes=MEDIA_CHUNK_BYTES + 1), "bad_frame")
        await err(c.send_text("x", id="i" * 129), "bad_frame")
        assert len(media_frames(bytes(MIN_MEDIA_CHUNK_BYTES * MAX_MEDIA_PARTS), "document", "f", chunk_bytes=MIN_MEDIA_CHUNK_BYTES)) == MAX_MEDIA_PARTS
        with pytest.raises(HermesError) as e:
            media_frames(bytes(MIN_MEDIA_CHUNK_BYTES * MAX_MEDIA_PARTS + 1), "document", "f",
                         chunk_bytes=MIN_MEDIA_CHUNK_BYTES, max_bytes=MAX_MEDIA_BYTES + 1)
        assert e.value.code == "too_big"
        assert [(f["part"], f["parts"]) for f in media_frames(bytes(MEDIA_CHUNK_BYTES + 1), "document", "f")] == [(0, 2), (1, 2)]
        assert len(c.pending) == 2
    run(go())


def test_file_in_parts_comes_back_whole(gateway):
    async def go():
        c = client(gateway, uniq("py-file"))
        await c.connect()
        data = bytes((i * 31) & 0xFF for i in range(MEDIA_CHUNK_BYTES + 1000))
        parts, acks = [], []
        c.on("sent", lambda f: f["t"] == "media" and parts.append((f["part"], f["parts"])))
        c.on("sent", lambda f: f["t"] == "ack" and acks.append(f["id"]))
        got = asyncio.ensure_future(c.wait_for("media", timeout=30))
        mid = await c.send_file(data, "document", mime="application/octet-stream", filename="big.bin")
        f = await got
        assert parts == [(0, 2), (1, 2)]
        assert f["reply_to"] == mid and f["filename"] == "big.bin" and f["size"] == len(data)
        assert f["data"] == data
        assert acks == [f["id"]]
        await c.close()
    run(go())


def test_voice(gateway):
    async def go():
        c = client(gateway, uniq("py-voice"))
        await c.connect()
        final = asyncio.ensure_future(c.wait_for("message", lambda m: m["final"]))
        await c.send_voice(bytes(1234), "wav", text="hi")
        assert (await final)["text"] == "Received audio: 1234 bytes (wav). Recognised text: hi"
        await c.close()
    run(go())


def test_card(gateway):
    async def go():
        c = client(gateway, uniq("py-card"))
        await c.connect()
        card = asyncio.ensure_future(c.wait_for("prompt"))
        await c.send_text("/approve ls -la")
        card = await card
        assert card["kind"] == "exec_approval" and card["command"] == "ls -la"
        assert sorted(o["id"] for o in card["options"]) == ["always", "deny", "once", "session"]
        done = asyncio.ensure_future(c.wait_for("prompt_done"))
        resolved = asyncio.ensure_future(c.wait_for("message", lambda m: m["final"]))
        await c.answer(card["id"], "once")
        assert (await done)["option_id"] == "once"
        assert (await resolved)["text"] == "exec_approval resolved: once"
        gone = asyncio.ensure_future(c.wait_for("prompt_done", lambda d: d["id"] == "no-such-card"))
        await c.answer("no-such-card", "once")
        assert (await gone)["expired"] is True
        assert await c.ping() >= 0
        await c.close()
    run(go())


def test_deliver_and_delivered(gateway):
    async def go():
        target = client(gateway, uniq("py-target"))
        cron = client(gateway, uniq("py-cron"))
        await target.connect()
        await cron.connect()
        m = asyncio.ensure_future(target.wait_for("message", lambda m: m["final"]))
        d = asyncio.ensure_future(cron.wait_for("delivered"))
        mid = await cron.deliver(target=target.device["id"], text="reminder")
        assert (await m)["text"] == "reminder"
        assert await d == {"id": mid, "device": target.device["id"]}
        await target.close()
        await cron.close()
    run(go())


def test_reconnect_resends_with_the_same_id(gateway):
    async def go():
        c = client(gateway, uniq("py-resend"))
        await c.connect()
        warm = asyncio.ensure_future(c.wait_for("message", lambda m: m["final"]))
        warm_taken = asyncio.ensure_future(c.wait_for("acknowledged"))
        await c.send_text("warm up")
        await asyncio.gather(warm, warm_taken)
        texts, finals = [], []
        c.on("sent", lambda f: f["t"] == "text" and texts.append(f["id"]))
        c.on("message", lambda m: m["final"] and finals.append(m["text"]))
        ready = asyncio.ensure_future(c.wait_for("ready"))
        mid = await c.send_text("survive the drop")
        c.drop()
        await c.send_text("sent while offline")  # queued, or written and resent, after the drop
        await ready
        want = {"You said: survive the drop", "You said: sent while offline"}
        # An answer written to the dropped socket may come back only after
        # the edge's 10 s AckWait (from the outbox): wait longer than that.
        while not want <= set(finals):
            await c.wait_for("message", lambda m: m["final"], timeout=30)
        while c.pending:
            await c.wait_for("acknowledged", timeout=30)
        assert texts.count(mid) == 2, texts
        await c.ping()
        assert finals.count("You said: survive the drop") == 1, finals
        await c.close()
    run(go())


def test_auth_failed_stops(gateway):
    async def go():
        c = client(gateway, uniq("py-auth"), token="wrong")
        states = []
        c.on("state", states.append)
        with pytest.raises(HermesError) as e:
            await c.connect()
        assert e.value.code == "auth_failed" and e.value.permanent
        other = client(gateway, uniq("py-other"))
        await other.connect()
        await other.ping()
        await other.ping()
        assert states.count("connecting") == 1, states
        await other.close()
        await c.close()
    run(go())


def test_wrong_token_leaves_no_task(gateway):
    """A script whose asyncio.run ends in the auth error prints that error
    and nothing else: connect() lets the connection task end and the
    handlers run before it raises, so no task of the client is destroyed
    pending on a closed loop."""
    script = (
        "import asyncio, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from hermes_client import Client\n"
        "async def main():\n"
        "    c = Client(sys.argv[2], 'wrong', {'id': 'py-wrong-token', 'name': 'x'})\n"
        "    c.on('error', lambda e: print('error:', e.code))\n"
        "    await c.connect()\n"
        "asyncio.run(main())\n"
    )
    sdk = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", script, sdk, gateway.ws], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout == "error: auth_failed\n", p.stdout
    last = p.stderr.rstrip().splitlines()[-1]
    assert last == "hermes_client.HermesError: auth_failed: invalid token", p.stderr
    for noise in ("Task was destroyed", "Event loop is closed", "Exception ignored"):
        assert noise not in p.stderr, p.stderr


def test_forbidden_stops(bound_gateway):
    async def go():
        c = client(bound_gateway, "bound-dev")
        with pytest.raises(HermesError) as e:
            await c.connect()
        assert e.value.code in ("forbidden", "auth_failed")
        ok = client(bound_gateway, "bound-dev", token="bound-token")
        await ok.connect()
        await ok.close()
    run(go())


def test_owner_key(owners_gateway):
    """An owner's app key of the tenants file is taken as the token: the
    phone connects as a device of that owner (ready names its plain id),
    and the demo agent answers it; the key with a wrong secret is
    auth_failed."""
    async def go():
        dev = uniq("py-owner")
        c = client(owners_gateway, dev, token=owners_gateway.owner_key)
        ready = await c.connect()
        try:
            assert ready["session"] == "mobile:" + dev
            assert ready["device"]["id"] == dev
            final = asyncio.ensure_future(c.wait_for("message", lambda m: m["final"]))
            await c.send_text("hello from acme")
            assert (await final)["text"] == "You said: hello from acme"
        finally:
            await c.close()
        wrong = client(owners_gateway, uniq("py-owner"), token=owners_gateway.owner_key.rsplit(".", 1)[0] + ".wrong")
        with pytest.raises(HermesError) as e:
            await wrong.connect()
        assert e.value.code == "auth_failed" and e.value.permanent
        await wrong.close()
    run(go())


def test_typing_and_unknown_frames(gateway):
    async def go():
        c = client(gateway, uniq("py-typing"))
        await c.connect()
        errors, sent, events = [], [], []
        c.on("error", errors.append)
        c.on("sent", lambda f: sent.append(f["t"]))
        for e in ("message", "media", "prompt", "prompt_done", "avatar", "typing", "delivered"):
            c.on(e, lambda v, e=e: events.append((e, v)))
        await c.send_typing()
        await c._handle({"t": "hologram", "id": "x", "text": "from a later version"})
        assert await c.ping() >= 0
        assert sent == ["typing", "ping"]
        assert errors == [] and events == []
        await c.close()
    run(go())


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_or_bad_url_fails_connect(gateway):
    async def go():
        for url in (f"ws://127.0.0.1:{closed_port()}/ws", "not a url"):
            c = Client(url, gateway.token, {"id": uniq("py-unreachable")}, min_delay=0.05, max_delay=0.5)
            errors, states = [], []
            c.on("error", errors.append)
            c.on("state", states.append)
            with pytest.raises(HermesError) as e:
                await asyncio.wait_for(c.connect(), 10)
            assert e.value.code == "connect_failed" and e.value.local, e.value
            other = client(gateway, uniq("py-other"))
            await other.connect()
            await other.ping()
            await other.close()
            assert [x.code for x in errors] == ["connect_failed"], url
            assert states.count("connecting") == 1, states
            assert c.state == "closed"
            await c.close()
    run(go())


def test_connect_and_ready_timeouts():
    # A stalled server cannot be had from a real edge: a TCP listener that
    # never answers the upgrade, and a WebSocket server that never says ready.
    async def go():
        tcp = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        async with websockets.serve(lambda ws, *_: ws.wait_closed(), "127.0.0.1", 0) as wss:
            stalls = [(tcp.sockets[0].getsockname()[1], {"connect_timeout": 0.3}, "no connection within 0.3 s"),
                      (wss.sockets[0].getsockname()[1], {"ready_timeout": 0.3}, "no ready within 0.3 s")]
            for port, kw, why in stalls:
                c = Client(f"ws://127.0.0.1:{port}/ws", "t", {"id": uniq("py-stall")}, **kw)
                t0 = time.monotonic()
                with pytest.raises(HermesError) as e:
                    await asyncio.wait_for(c.connect(), 10)
                assert e.value.code == "connect_failed" and why in e.value.message, e.value
                assert time.monotonic() - t0 >= 0.3
        tcp.close()
    run(go())


def test_replaced_does_not_reconnect_and_a_drop_does(gateway):
    async def go():
        dev = uniq("py-replaced")
        a = client(gateway, dev)
        await a.connect()
        states = []
        a.on("state", states.append)
        gone = asyncio.ensure_future(a.wait_for("disconnected"))
        b = client(gateway, dev)
        await b.connect()
        assert await gone == {"code": 1000, "reason": "replaced by a newer connection", "reconnect": False}
        await b.ping()
        await b.ping()
        assert "connecting" not in states, states
        assert a.state == "closed" and b.state == "open"
        dropped = asyncio.ensure_future(b.wait_for("disconnected"))
        ready = asyncio.ensure_future(b.wait_for("ready"))
        b.drop()
        assert (await dropped)["reconnect"] is True
        await ready
        await b.close()
        await a.close()
    run(go())


def test_internal_error_resends_back_off_and_give_up(small_store_gateway):
    async def go():
        gw = small_store_gateway
        c = Client(gw.ws, gw.token, {"id": uniq("py-resend-cap")}, min_delay=0.04, max_delay=0.16, max_resends=4)
        await c.connect()
        at = []
        c.on("sent", lambda f: f["t"] == "media" and f["part"] == 0 and at.append(time.monotonic()))
        given_up = asyncio.ensure_future(c.wait_for("error", lambda e: "given up" in e.message, timeout=30))
        mid = await c.send_file(bytes(1536 * 1024), "document", filename="big.bin", chunk_bytes=1024 * 1024)
        err = await given_up
        assert err.code == "internal_error" and err.id == mid
        assert len(at) == 5, at  # the first send and max_resends resends
        assert c.pending == []
        gaps = [b - a for a, b in zip(at, at[1:])]
        # Each pause is drawn from [cap/2, cap], cap = min(max_delay, min_delay*2^n): 0.04, 0.08, 0.16, 0.16.
        assert all(g >= m for g, m in zip(gaps, [0.02, 0.04, 0.08, 0.08])), gaps
        await c.close()
    run(go())


def test_slow_handler_does_not_stall_the_connection(gateway):
    async def go():
        c = client(gateway, uniq("py-slow"), pong_timeout=5)
        await c.connect()
        rtts, states = [], []
        c.on("state", states.append)

        async def slow(m):
            if m["final"]:
                rtts.append(await c.ping())  # the pong comes through the receive loop

        c.on("message", slow)
        final = asyncio.ensure_future(c.wait_for("message", lambda m: m["final"]))
        await c.send_text("hello")
        await final
        while not rtts:
            await c.wait_for("sent", lambda f: f["t"] == "ack")
        assert rtts[0] < 5, rtts
        assert states == [], states
        await c.close()
    run(go())


def test_answers_and_deliveries_made_offline_go_after_reconnect(gateway):
    async def go():
        c = client(gateway, uniq("py-offline"))
        await c.connect()
        card = asyncio.ensure_future(c.wait_for("prompt"))
        await c.send_text("/approve uptime")
        card = await card
        target = client(gateway, uniq("py-offline-target"))
        await target.connect()
        c.drop()
        done = asyncio.ensure_future(c.wait_for("prompt_done", lambda d: d["id"] == card["id"], timeout=30))
        reminder = asyncio.ensure_future(target.wait_for("message", lambda m: m["final"], timeout=30))
        await c.answer(card["id"], "deny")
        await c.deliver(target=target.device["id"], text="made offline")
        assert (await done)["option_id"] == "deny"
        assert (await reminder)["text"] == "made offline"
        await c.close()
        await target.close()
    run(go())


def test_error_names_the_frame_it_answers(gateway):
    async def go():
        c = client(gateway, uniq("py-error-id"))
        await c.connect()
        err = asyncio.ensure_future(c.wait_for("error"))
        mid = await c.deliver(target=uniq("nobody-here"), text="to no one")
        err = await err
        assert err.code == "device_offline" and err.id == mid
        await c.close()
    run(go())


def test_truncated_file_is_refused():
    # A real edge never sends this: a WebSocket server that does.
    async def serve(ws, *_):
        await ws.recv()
        await ws.send(json.dumps({"t": "ready", "v": 1, "session": "mobile:x", "device": {"id": "x"}, "capabilities": {}}))
        await ws.send(json.dumps({"t": "media", "id": "half", "kind": "document", "filename": "a.txt", "size": 8,
                                  "part": 1, "parts": 2, "final": True, "data": "YWJjZA=="}))
        await ws.send(json.dumps({"t": "media", "id": "whole", "kind": "document", "filename": "b.txt", "size": 4,
                                  "data": "YWJjZA=="}))
        await ws.wait_closed()

    async def go():
        async with websockets.serve(serve, "127.0.0.1", 0) as wss:
            c = Client(f"ws://127.0.0.1:{wss.sockets[0].getsockname()[1]}/ws", "t", {"id": "x"})
            files, acks = [], []
            c.on("media", lambda f: files.append(f["id"]))
            c.on("sent", lambda f: f["t"] == "ack" and acks.append(f["id"]))
            err = asyncio.ensure_future(c.wait_for("error"))
            whole = asyncio.ensure_future(c.wait_for("sent", lambda f: f["t"] == "ack"))
            await c.connect()
            assert (await err).id == "half"
            await whole
            assert files == ["whole"] and acks == ["whole"]
            await c.close()
    run(go())


def test_typing_clears_by_itself(gateway):
    async def go():
        c = client(gateway, uniq("py-typing-idle"), typing_idle=0.2)
        await c.connect()
        seen = []
        c.on("typing", seen.append)
        off = asyncio.ensure_future(c.wait_for("typing", lambda on: not on, timeout=10))
        t0 = time.monotonic()
        await c._handle({"t": "typing"})  # the agent's typing, then nothing
        await off
        assert time.monotonic() - t0 >= 0.2
        assert seen == [True, False] and c.typing is False
        await c.close()
    run(go())


def test_once_off_and_events_iterator(gateway):
    async def go():
        c = client(gateway, uniq("py-api"))
        await c.connect()
        first, never = [], []
        c.once("message", lambda m: first.append(m["text"]))
        fn = never.append
        c.on("message", fn)
        c.off("message", fn)
        got = []

        async def read():
            async for name, value in c.events(["message", "acknowledged"]):
                got.append(name)
                if name == "message" and value["final"]:
                    break

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0)  # the iterator is listening
        await c.send_text("iterate")
        await asyncio.wait_for(reader, 30)
        assert first == ["You said: "] and never == []
        assert got.count("message") == 3, got
        # A closed client ends its iterators.
        rest = asyncio.ensure_future(c.events().__anext__())
        await asyncio.sleep(0)
        await c.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(rest, 5)
    run(go())


def test_get_token_and_logger(gateway, caplog):
    async def go():
        asked = []

        async def token():
            asked.append(1)
            return gateway.token

        c = client(gateway, uniq("py-token"), token="stale", get_token=token)

        def broken(_):
            raise RuntimeError("a broken handler")

        c.on("ready", broken)
        await c.connect()
        back = asyncio.ensure_future(c.wait_for("ready"))
        c.drop()
        await back
        assert len(asked) == 2, "a fresh token for each connection"
        await c.close()
    with caplog.at_level("INFO", logger="hermes_client"):
        run(go())
    assert any(r.levelname == "ERROR" and "ready handler raised" in r.getMessage() for r in caplog.records), caplog.records
    assert any(r.levelname == "WARNING" and "socket closed" in r.getMessage() for r in caplog.records)


def test_cancelled_connect_closes(gateway):
    async def go():
        tcp = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        c = Client(f"ws://127.0.0.1:{tcp.sockets[0].getsockname()[1]}/ws", "t", {"id": uniq("py-cancel")})
        task = asyncio.ensure_future(c.connect())
        await c.wait_for("state", lambda s: s == "connecting") if c.state != "connecting" else None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c.state == "closed"
        tcp.close()
    run(go())



def test_reconnect_storm_waits_retry_after_then_connects(busy_gateway, monkeypatch):
    """An upgrade refused with 503 and Retry-After: the next attempt comes no
    sooner than Retry-After after it, and the client connects once there is room."""
    gw = busy_gateway
    connect = websockets.connect
    attempts = []  # {"at": start, "error": the refusal}, one per attempt of the client
    pauses = []  # (start, seconds) of each pause before a reconnect
    changed = None  # set at each attempt, refusal and pause

    def note():
        if changed is not None:
            changed.set()

    class Traced:
        """websockets.connect, recording each attempt and the exception of a refused one."""

        def __init__(self, *a, **kw):
            self.inner, self.record = connect(*a, **kw), {"at": time.monotonic()}
            attempts.append(self.record)
            note()

        async def __aenter__(self):
            try:
                return await self.inner.__aenter__()
            except Exception as e:
                self.record["error"] = e
                note()
                raise

        async def __aexit__(self, *exc):
            return await self.inner.__aexit__(*exc)

    async def sleep(delay):
        pauses.append((time.monotonic(), delay))
        note()
        await asyncio.sleep(delay)

    async def until(pred, what, timeout=60.0):
        deadline = time.monotonic() + timeout
        while not pred():
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise AssertionError(f"no {what} within {timeout} s; attempts {attempts}") from None

    async def go():
        nonlocal changed
        changed = asyncio.Event()
        blockers = []

        async def block():
            blockers.append(await connect(gw.ws, ping_interval=None))  # upgraded, never says hello

        def unblock():
            while blockers:
                blockers.pop().transport.abort()

        min_delay, max_delay = 0.1, 1.0
        c = Client(gw.ws, gw.token, {"id": uniq("py-storm")}, min_delay=min_delay, max_delay=max_delay,
                   random=lambda: 0.5, sleep=sleep)

        retries = []
        c.on("retry", retries.append)
        try:
            await block()
            ready = asyncio.ensure_future(c.connect())
            # The first connection is refused: connect() waits and tries again rather than failing.
            for phase in ("connect", "reconnect"):
                if phase == "reconnect":
                    # Up only a moment: a drop reconnects into a full hello phase again.
                    await block()
                    ready = asyncio.ensure_future(c.wait_for("ready", timeout=60))
                    c.drop()
                n = len(attempts)
                await until(lambda: any("error" in a for a in attempts[n:]), "refused attempt")
                k = next(i for i in range(n, len(attempts)) if "error" in attempts[i])
                await until(lambda: len(attempts) > k + 1, "attempt after the refusal")
                err = attempts[k]["error"]
                # InvalidStatusCode (websockets before 14) or InvalidStatus (14 and later).
                response = err if hasattr(err, "status_code") else getattr(err, "response", None)
                assert getattr(response, "status_code", None) == 503, repr(err)
                header = response.headers.get_all("Retry-After")
                assert header and header[0].isdigit(), header
                ra = float(header[0])
                assert ra >= 1
                start, delay = next(p for p in pauses if attempts[k]["at"] <= p[0] <= attempts[k + 1]["at"])
                assert ra + 0.5 * min_delay <= delay <= min(300.0, ra + 0.5 * max_delay), delay
                gap = attempts[k + 1]["at"] - start
                assert gap >= ra, f"the next attempt came {gap:.3f} s after a 503 with Retry-After {header[0]}"
                unblock()
                assert (await asyncio.wait_for(ready, 60))["t"] == "ready"
                assert c.state == "open"
        finally:
            unblock()
            await c.close()
        # The retry events, once their handlers ran: the refusals as the client
        # read them, and a count of attempts that went on across the short-lived connection.
        refusals = [r for r in retries if r["status"] == 503]
        assert len(refusals) >= 2 and all(r["retry_after"] >= 1 for r in refusals), retries
        counts = [r["attempt"] for r in retries]
        assert counts == list(range(len(counts))), retries
        for r in refusals:
            assert r["delay"] == min(300.0, r["retry_after"] + 0.5 * min(max_delay, min_delay * 2 ** r["attempt"])), r

    monkeypatch.setattr(websockets, "connect", Traced)
    run(go())


def test_push_registration(push_gateway, gateway):
    """The app registers its own FCM or APNs token and takes it back; the
    gateway's refusals and the local ones are typed; a gateway without push
    services offers none, and nothing is sent to it."""
    async def go():
        c = client(push_gateway, uniq("py-push"))
        ready = await c.connect()
        try:
            assert ready["capabilities"]["push"] == ["fcm", "apns"]
            answers, sent = [], []
            c.on("push", answers.append)
            c.on("sent", lambda f: f["t"] == "push" and sent.append(f))
            await c.register_push("fcm", "dGVzdA:APA91bH-test_token.1")
            await c.register_push("apns", "0a1b2c3d4e5f")
            await c.remove_push("apns")
            await asyncio.sleep(0.05)  # the handlers run after the answers
            assert answers == [{"kind": "fcm", "registered": True}, {"kind": "apns", "registered": True},
                               {"kind": "apns", "registered": False}]
            assert sent[2] == {"t": "push", "kind": "apns", "token": ""}
            with pytest.raises(HermesError) as e:
                await c.register_push("apns", "not-hex")  # the gateway's refusal
            assert e.value.code == "bad_frame" and not e.value.local and "hex" in e.value.message
            with pytest.raises(HermesError) as e:
                await c.register_push("fcm", "a b")  # refused before sending
            assert e.value.code == "bad_frame" and e.value.local
            await c.register_push("fcm", "dGVzdA:APA91bH-test_token.2")
            await asyncio.sleep(0.05)
            assert len(sent) == 5
        finally:
            await c.close()

        plain = client(gateway, uniq("py-nopush"))
        ready = await plain.connect()
        try:
            assert "push" not in ready["capabilities"]
            wrote = []
            plain.on("sent", lambda f: f["t"] == "push" and wrote.append(f))
            with pytest.raises(HermesError) as e:
                await plain.register_push("fcm", "tok")
            assert e.value.code == "unsupported_frame" and e.value.local and not wrote
        finally:
            await plain.close()
    run(go())
