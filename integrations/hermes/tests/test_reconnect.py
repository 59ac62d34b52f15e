"""The event stream survives its connection: cut mid-stream, a router that
refuses for a while, and a restart of the plugin lose and repeat nothing."""

import asyncio
from urllib.parse import urlsplit

from conftest import Hermes, Phone, device_id, env, run


class Proxy:
    """A TCP proxy in front of the router that can cut its connections and
    refuse new ones, as a router restart or a network drop does."""

    def __init__(self):
        u = urlsplit(env("MOBILE_TEST_ROUTER_URL"))
        self.target = (u.hostname, u.port)
        self.down = False
        self.conns = set()
        self.accepted = 0

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader, writer):
        if self.down:
            writer.close()
            return
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.conns.update((writer, up_writer))

        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self):
        for w in self.conns:
            w.transport.abort()
        self.conns.clear()

    async def close(self):
        self.cut()
        self.server.close()


def test_reconnect_resumes_without_loss_or_repeat(tmp_path):
    async def main():
        dev = device_id("rc")
        proxy = await Proxy().start()
        hermes = await Hermes(tmp_path, router_url=proxy.url).start()
        got = []
        try:
            async with Phone(dev) as phone:
                for i in range(5):
                    await phone.text(f"m-{i}", f"text {i}")
                for _ in range(3):
                    got.append((await hermes.next_event(dev)).text)
                # Mid-stream: the connection drops and the router is away.
                proxy.down = True
                proxy.cut()
                for i in range(5, 10):
                    await phone.text(f"m-{i}", f"text {i}")
                await asyncio.sleep(1.5)
                proxy.down = False
                for _ in range(7):
                    got.append((await hermes.next_event(dev, timeout=20)).text)
                assert got == [f"text {i}" for i in range(10)]
                assert proxy.accepted >= 2  # it did reconnect
                await hermes.no_event(dev)

                # A restarted plugin goes on from the saved cursor.
                await hermes.stop()
                hermes = await Hermes(tmp_path, router_url=proxy.url).start(from_now=False)
                await phone.text("m-10", "text 10")
                assert (await hermes.next_event(dev)).text == "text 10"
                await hermes.no_event(dev)
        finally:
            await hermes.stop()
            await proxy.close()

    run(main())
