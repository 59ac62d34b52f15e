"""The reconnect backoff without a network: the computation (full jitter,
Retry-After as a floor, the cap, Retry-After parsing), the reading of a
refused upgrade from both websockets APIs, and the client's use of it
against scripted connections, with the random source, the sleep and the
clock injected, so every pause is known exactly."""

import asyncio
import calendar
import json
import random
import types

import pytest
import websockets
import websockets.exceptions
from websockets.datastructures import Headers
from websockets.http11 import Response

import hermes_client
from hermes_client import Client, HermesError, _refusal
from hermes_client.backoff import (MAX_RETRY_AFTER, backoff_window, full_jitter, parse_retry_after,
                                   retry_delay)

BASE, CAP = 0.5, 30.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_full_jitter_bounds_at_each_attempt():
    for n in range(13):
        window = min(CAP, BASE * 2 ** n)
        assert backoff_window(n, BASE, CAP) == window
        assert full_jitter(n, BASE, CAP, lambda: 0.0) == 0.0
        assert window - full_jitter(n, BASE, CAP, lambda: 1 - 2 ** -40) < 1e-9
        rnd = random.Random(n).random
        draws = [full_jitter(n, BASE, CAP, rnd) for _ in range(2000)]
        assert all(0 <= d < window for d in draws), n
        # Spread over the whole window, not bunched at one end.
        assert min(draws) < window * 0.01 and max(draws) > window * 0.99, (n, min(draws), max(draws))
    assert backoff_window(5000, BASE, CAP) == CAP
    assert backoff_window(-1, BASE, CAP) == BASE
    assert backoff_window(3, 0, CAP) == 0


def test_random_out_of_range_stays_in_the_window():
    assert full_jitter(0, BASE, CAP, lambda: -3) == 0
    assert full_jitter(0, BASE, CAP, lambda: 7) == BASE
    assert full_jitter(0, BASE, CAP, lambda: float("nan")) == 0


def test_retry_after_is_a_floor_and_the_cap_holds():
    for n in range(11):
        window = min(CAP, BASE * 2 ** n)
        for ra in (0.0, 1.0, 5.0, 30.0):
            assert retry_delay(n, BASE, CAP, lambda: 0.0, floor=ra) == ra
            assert retry_delay(n, BASE, CAP, lambda: 0.5, floor=ra) == ra + window / 2
            rnd = random.Random(100 + n).random
            for _ in range(500):
                d = retry_delay(n, BASE, CAP, rnd, floor=ra)
                assert ra <= d < ra + window, (n, ra, d)
    assert retry_delay(3, BASE, CAP, lambda: 0.25) == 1.0  # no floor: plain full jitter
    assert MAX_RETRY_AFTER == 300.0
    assert retry_delay(0, BASE, CAP, lambda: 0.9, floor=3600) == MAX_RETRY_AFTER
    assert retry_delay(8, BASE, CAP, lambda: 0.9, floor=299) == MAX_RETRY_AFTER
    assert retry_delay(8, BASE, CAP, lambda: 0.9, floor=60, max_delay=45) == 45
    assert retry_delay(0, BASE, CAP, lambda: 0.9, floor=float("inf")) == MAX_RETRY_AFTER


def test_parse_retry_after():
    now = calendar.timegm((1994, 11, 6, 8, 49, 30, 0, 0, 0))  # 7 s before the RFC's example date
    assert parse_retry_after("5", now) == 5
    assert parse_retry_after(" 30 ", now) == 30
    assert parse_retry_after("0", now) == 0
    assert parse_retry_after(["2", "9"], now) == 2  # the first of repeated headers
    assert parse_retry_after("9" * 400, now) == float("inf")  # bounded by the cap
    # RFC 9110's three forms of one instant.
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now) == 7
    assert parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now) == 7
    assert parse_retry_after("Sun Nov  6 08:49:37 1994", now) == 7
    assert parse_retry_after("sun, 06 nov 1994 08:49:37 gmt", now) == 7
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now) == 0  # already past: no wait
    for bad in (None, [], "", "   ", "soon", "-1", "1.5", "5s", "+5", "0x10", "1e3", "5, 6", "٣",
                "Sun, 06 Nov 1994 08:49:37 PST", "Sun, 06 Foo 1994 08:49:37 GMT",
                "Sun, 06 Nov 1994 25:49:37 GMT", "Sun, 6 Nov 1994 08:49:37 GMT"):
        assert parse_retry_after(bad, now) is None, bad


def refused(status, retry_after=None):
    """The exception this websockets raises for an upgrade answered with status."""
    headers = Headers()
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return websockets.exceptions.InvalidStatusCode(status, headers)


def test_refusal_from_both_websockets_apis():
    assert _refusal(refused(503, "5")) == (503, 5.0)
    assert _refusal(refused(429)) == (429, None)
    assert _refusal(refused(503, "later")) == (503, None)
    # websockets 14 and later: InvalidStatus with the response.
    response = Response(503, "Service Unavailable", Headers([("Retry-After", "7")]))
    assert _refusal(websockets.exceptions.InvalidStatus(response)) == (503, 7.0)
    assert _refusal(OSError("connection refused")) is None
    assert _refusal(asyncio.TimeoutError()) is None


# Scripted connections: each attempt takes the next step of the script.
# ("refuse", status, retry_after) raises as websockets does; ("accept",)
# opens and says ready to hello; ("fatal", code) answers hello with a
# fatal error frame and closes 1008 with the code.

class FakeSocket:
    def __init__(self, fatal=None):
        self.fatal = fatal
        self.q = asyncio.Queue()
        self.close_code, self.close_reason = None, ""
        self.transport = types.SimpleNamespace(abort=lambda: self.end(1006))

    def end(self, code, reason=""):
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
            self.q.put_nowait(None)

    async def send(self, data):
        f = json.loads(data)
        if f["t"] == "hello" and self.fatal:
            self.q.put_nowait(json.dumps({"t": "error", "code": self.fatal, "message": "no", "fatal": True}))
            self.end(1008, self.fatal)
        elif f["t"] == "hello":
            dev = f["device"]["id"]
            self.q.put_nowait(json.dumps({"t": "ready", "v": 1, "session": "mobile:" + dev,
                                          "device": {"id": dev, "name": ""}, "avatar_url": "", "capabilities": {}}))
        elif f["t"] == "ping":
            self.q.put_nowait(json.dumps({"t": "pong", "ts": f["ts"]}))

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.q.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def close(self):
        self.end(1000)


class Script:
    def __init__(self, steps):
        self.steps = list(steps)
        self.attempts = 0

    def connect(self, url, **kw):
        self.attempts += 1
        step = self.steps.pop(0) if self.steps else ("refuse", 503, "1")
        script = self

        class Connect:
            async def __aenter__(self):
                if step[0] == "refuse":
                    raise refused(step[1], step[2])
                script.socket = FakeSocket(step[1] if step[0] == "fatal" else None)
                return script.socket

            async def __aexit__(self, *exc):
                return False

        return Connect()


class ManualSleep:
    """An injected sleep that records each pause and ends it when the test says."""

    def __init__(self):
        self.pauses = asyncio.Queue()

    async def __call__(self, delay):
        done = asyncio.get_running_loop().create_future()
        await self.pauses.put((delay, done))
        await done

    async def next(self):
        return await asyncio.wait_for(self.pauses.get(), 5)


def fake_client(monkeypatch, steps, **kw):
    script = Script(steps)
    monkeypatch.setattr(hermes_client.websockets, "connect", script.connect)
    sleep = ManualSleep()
    clock = types.SimpleNamespace(t=0.0)
    opts = dict(ping_interval=0, random=lambda: 0.5, sleep=sleep, clock=lambda: clock.t)
    opts.update(kw)
    c = Client("ws://edge.test/ws", "t", {"id": "dev"}, **opts)
    retries = []
    c.on("retry", retries.append)
    return c, script, sleep, clock, retries


def test_client_waits_retry_after_plus_jitter_and_the_count_grows(monkeypatch):
    async def go():
        c, script, sleep, _, retries = fake_client(monkeypatch, [
            ("refuse", 503, "5"), ("refuse", 503, "2"), ("refuse", 429, "3"), ("refuse", 503, None),
            ("refuse", 503, "soon"), ("accept",)])
        ready = asyncio.ensure_future(c.connect())
        want = [(5 + 0.5 * 0.5, 503, 5.0), (2 + 0.5 * 1, 503, 2.0), (3 + 0.5 * 2, 429, 3.0),
                (0.5 * 4, 503, None),  # no Retry-After: full jitter
                (0.5 * 8, 503, None)]  # an unreadable one: ignored
        for i, (delay, status, ra) in enumerate(want):
            d, done = await sleep.next()
            assert d == delay, i
            assert script.attempts == i + 1, "no attempt before the pause ends"
            done.set_result(None)
        r = await ready
        assert r["t"] == "ready" and c.state == "open"
        await c.close()  # returns once the handlers have run
        assert [(x["attempt"], x["status"], x["retry_after"], x["delay"]) for x in retries] == [
            (i, s, ra, d) for i, (d, s, ra) in enumerate(want)]
        assert "HTTP 503, Retry-After 5 s" in retries[0]["reason"]
    run(go())


def test_client_caps_a_long_retry_after(monkeypatch):
    async def go():
        c, _, sleep, _, _ = fake_client(monkeypatch, [("refuse", 503, "86400"), ("accept",)], max_retry_after=120)
        ready = asyncio.ensure_future(c.connect())
        d, done = await sleep.next()
        assert d == 120
        done.set_result(None)
        await ready
        await c.close()
    run(go())


def test_client_backoff_starts_again_after_stable_after(monkeypatch):
    async def go():
        c, _, sleep, clock, retries = fake_client(monkeypatch, [("accept",)] * 4, stable_after=10)
        await c.connect()

        async def drop_after(up_for):
            clock.t += up_for
            ready = asyncio.ensure_future(c.wait_for("ready"))
            c.drop()
            _, done = await sleep.next()
            done.set_result(None)
            await ready

        await drop_after(1)  # short-lived connections: the count goes on
        await drop_after(1)
        await drop_after(10)  # up 10 s: starts again
        await c.close()
        assert [r["attempt"] for r in retries] == [0, 1, 0]
    run(go())


def test_client_fatal_errors_stop_and_other_first_refusals_fail(monkeypatch):
    async def go():
        for code in ("auth_failed", "forbidden"):
            c, script, _, _, retries = fake_client(monkeypatch, [("fatal", code)])
            with pytest.raises(HermesError) as e:
                await c.connect()
            assert e.value.code == code and e.value.fatal
            await c.close()
            assert retries == [] and script.attempts == 1
        c, _, _, _, retries = fake_client(monkeypatch, [("refuse", 404, None)])
        with pytest.raises(HermesError) as e:
            await c.connect()
        assert e.value.code == "connect_failed" and "HTTP 404" in e.value.message
        assert retries == []
        # Without reconnecting, a 503 fails connect() too.
        c, _, _, _, _ = fake_client(monkeypatch, [("refuse", 503, "1")], reconnect=False)
        with pytest.raises(HermesError) as e:
            await c.connect()
        assert e.value.code == "connect_failed" and "HTTP 503, Retry-After 1 s" in e.value.message
    run(go())


def test_close_ends_the_pause(monkeypatch):
    async def go():
        c, script, sleep, _, _ = fake_client(monkeypatch, [("refuse", 503, "30")])
        ready = asyncio.ensure_future(c.connect())
        d, _ = await sleep.next()  # never ended by the test: close() must end it
        assert d == 30 + 0.25
        await asyncio.wait_for(c.close(), 2)
        with pytest.raises(HermesError):
            await ready
        assert script.attempts == 1 and c.state == "closed"
    run(go())
