"""Test harness: a phone on the real edge WebSocket, the plugin on the real
router, the stand-ins of one Hermes version (hermes_v0_18, hermes_v0_21, hermes_v0_23) on the import path.

integrations/hermes/plugin_test.go starts the router (AGENT=link) and an edge
and runs this suite with MOBILE_TEST_* variables naming them.
"""

import asyncio
import base64
import json
import os
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# The Hermes line the stand-ins stand for: hermes_v0_18 (v0.18.2, 7a43ab04),
# hermes_v0_21 (v0.21.3, 00067189) or hermes_v0_23 (the newest line, modelled on the
# stored versions each file names: 04eef15a, 145695804, 0775bc80, ...).
# plugin_test.go runs the suite once for each.
HERMES_VERSION = os.getenv("MOBILE_TEST_HERMES", "0.23")
NEWEST = HERMES_VERSION == "0.23"
STUBS = HERE / ("hermes_v" + HERMES_VERSION.replace(".", "_"))
sys.path[:0] = [str(STUBS), str(HERE.parent)]

import aiohttp  # noqa: E402

ENV = ("MOBILE_TEST_ROUTER_URL", "MOBILE_TEST_AGENT_TOKEN", "MOBILE_TEST_DELIVER_TOKEN",
       "MOBILE_TEST_EDGE_WS", "MOBILE_TEST_APP_TOKEN")
WAIT = 10.0  # seconds any single expected thing may take


def pytest_collection_modifyitems(config, items):
    missing = [k for k in ENV if not os.getenv(k)]
    if missing:
        skip = pytest.mark.skip(reason="run through `go test ./integrations/hermes` (missing " + ", ".join(missing) + ")")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def hermes_home(tmp_path, monkeypatch):
    """A HERMES_HOME of the test's own, and no plugin settings from the shell."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    for k in list(os.environ):
        if k.startswith("MOBILE_") and not k.startswith("MOBILE_TEST_"):
            monkeypatch.delenv(k)
    yield tmp_path / "hermes"
    for k in list(os.environ):  # register() may set MOBILE_HOME_CHANNEL
        if k.startswith("MOBILE_") and not k.startswith("MOBILE_TEST_"):
            del os.environ[k]


def env(name: str) -> str:
    return os.environ[name]


def decided(got: dict):
    """(resolved, choice) of an approval wait's outcome (the newest line adds reason, and
    cancelled for a withdrawn approval)."""
    return got["resolved"], got["choice"]


def set_hermes_waits(monkeypatch, approval=None, clarify=None, slash_confirm=None):
    """Hermes's waits, in seconds: approvals.timeout, agent.clarify_timeout and the
    slash confirmation's."""
    if approval is not None:
        try:
            from tools import approval_context as where  # v0.21 and later
        except ImportError:
            from tools import approval as where  # v0.18
        monkeypatch.setattr(where, "TIMEOUT", approval)
    if clarify is not None:
        from tools import clarify_gateway
        monkeypatch.setattr(clarify_gateway, "get_clarify_timeout", lambda: clarify)
    if slash_confirm is not None:
        from tools import slash_confirm as sc
        monkeypatch.setattr(sc, "DEFAULT_TIMEOUT_SECONDS", slash_confirm, raising=False)


def run(coro):
    """Runs a test's coroutine, bounded so a hang fails instead of blocking CI."""
    return asyncio.run(asyncio.wait_for(coro, 120))


def device_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


class Phone:
    """One device on the edge's WebSocket, speaking Protocol v1."""

    def __init__(self, device: str, user_id: str = ""):
        self.device = device
        self.user_id = user_id or "u-" + device
        self.frames = []  # every frame received, in order
        self._seen = 0

    async def __aenter__(self):
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(env("MOBILE_TEST_EDGE_WS"), max_msg_size=16 * 1024 * 1024)
        await self.send(t="hello", token=env("MOBILE_TEST_APP_TOKEN"),
                        device={"id": self.device, "name": "Phone", "platform": "android", "app_version": "1.0.0"},
                        user={"id": self.user_id, "name": "Ann"})
        await self.expect(lambda f: f["t"] == "ready")
        return self

    async def __aexit__(self, *exc):
        await self.ws.close()
        await self.http.close()

    async def send(self, **frame):
        await self.ws.send_str(json.dumps(frame))

    async def text(self, msg_id: str, text: str):
        await self.send(t="text", id=msg_id, text=text)

    async def media(self, msg_id: str, kind: str, data: bytes, filename: str, caption: str = "", mime: str = ""):
        await self.send(t="media", id=msg_id, kind=kind, filename=filename, caption=caption, mime=mime,
                        data=base64.b64encode(data).decode())

    async def expect(self, match, timeout: float = WAIT) -> dict:
        """The first frame not looked at yet that match accepts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            while self._seen < len(self.frames):
                f = self.frames[self._seen]
                self._seen += 1
                if match(f):
                    return f
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"{self.device}: no expected frame within {timeout}s; got {self.frames}")
            try:
                msg = await self.ws.receive(timeout=left)
            except asyncio.TimeoutError:
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                kinds = [(f["t"], f.get("kind"), f.get("part"), f.get("code")) for f in self.frames[-6:]]
                raise AssertionError(f"{self.device}: socket ended: {msg.type} {msg.data} "
                                     f"{self.ws.close_code} {self.ws.exception()!r}; last frames {kinds}")
            self.frames.append(json.loads(msg.data))


async def latest_cursor() -> str:
    """The cursor after every event logged so far, so a test sees only its own."""
    cursor = ""
    async with aiohttp.ClientSession() as http:
        while True:
            url = env("MOBILE_TEST_ROUTER_URL") + "/v1/events"
            params = {"format": "json", "max": "1000", "cursor": cursor}
            headers = {"Authorization": "Bearer " + env("MOBILE_TEST_AGENT_TOKEN")}
            async with http.get(url, params=params, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                doc = await resp.json()
            if not doc["events"]:
                return doc["cursor"]
            cursor = doc["cursor"]


class Hermes:
    """The plugin's adapter as Hermes runs it, with the events it hands over."""

    def __init__(self, tmp_path: Path, router_url: str = "", token: str = ""):
        from adapter import MobileAdapter
        from gateway.config import PlatformConfig

        self.cursor_file = tmp_path / "cursor"
        extra = {"router_url": router_url or env("MOBILE_TEST_ROUTER_URL"),
                 "agent_token": token or env("MOBILE_TEST_AGENT_TOKEN"),
                 "cursor_file": str(self.cursor_file)}
        self.adapter = MobileAdapter(PlatformConfig(extra=extra))
        self.events = asyncio.Queue()
        self.adapter.set_message_handler(self._handle)

    async def _handle(self, event):
        await self.events.put(event)

    async def start(self, from_now: bool = True):
        if from_now and not self.cursor_file.exists():
            self.cursor_file.write_text(await latest_cursor())
        assert await self.adapter.connect()
        return self

    async def next_event(self, device: str, timeout: float = WAIT):
        """The next event of device (other devices' events are skipped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"no event of {device} within {timeout}s")
            try:
                ev = await asyncio.wait_for(self.events.get(), left)
            except asyncio.TimeoutError:
                continue
            from adapter import _device_of
            if _device_of(ev.source.chat_id) == device:
                return ev

    async def no_event(self, device: str, wait: float = 1.5):
        with pytest.raises(AssertionError):
            ev = await self.next_event(device, wait)
            raise RuntimeError(f"unexpected event: {ev}")

    async def stop(self):
        await self.adapter.disconnect()
