"""Trace context: the plugin answers an event with its traceparent (W3C trace
context) as a header, so a router that continues traces joins the answer to the
phone's message. A router that ignores the header loses nothing. Tested against
a stand-in router that records what it is sent: the suite's real router runs
without tracing, so its events carry no traceparent."""

import asyncio
import json

from aiohttp import web

from conftest import Hermes, run

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class FakeRouter:
    """GET /v1/events serves the given events, then holds the stream open; every
    other call is recorded (method, path, traceparent header) and answered 200."""

    def __init__(self, events):
        self.events, self.seen = events, []

    async def start(self):
        app = web.Application()
        app.router.add_get("/v1/events", self.stream)
        app.router.add_route("*", "/v1/sessions/{session}/{what:.*}", self.record)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
        return self

    async def stream(self, req):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for i, ev in enumerate(self.events):
            await resp.write(f"id: c{i + 1}\ndata: {json.dumps(ev)}\n\n".encode())
        await asyncio.sleep(3600)
        return resp

    async def record(self, req):
        self.seen.append((req.method, req.match_info["what"], req.headers.get("traceparent")))
        return web.json_response({"ok": True, "id": "x-%d" % len(self.seen)})

    async def stop(self):
        await self.runner.cleanup()


def test_answers_carry_the_events_traceparent(tmp_path):
    """Every call answering a device (message, edit, typing, card, closing a
    card) carries the traceparent of that device's latest event; a device whose
    event has none (or a malformed one) gets no header."""
    async def main():
        router = await FakeRouter([
            {"kind": "text", "session": "mobile:tel-1", "device": "tel-1", "id": "m-1", "text": "hi",
             "traceparent": TRACE},
            {"kind": "text", "session": "mobile:tel-2", "device": "tel-2", "id": "m-2", "text": "hi",
             "traceparent": "00-not-a-trace\r\nX-Evil: 1"},
        ]).start()
        hermes = Hermes(tmp_path, router_url=router.url, token="t")
        hermes.cursor_file.write_text("")
        await hermes.start(from_now=False)
        a = hermes.adapter
        try:
            ev1 = await hermes.next_event("tel-1")
            ev2 = await hermes.next_event("tel-2")
            res = await a.send(ev1.source.chat_id, "answer", metadata={"expect_edits": True})
            await a.edit_message(ev1.source.chat_id, res.message_id, "answer, edited", finalize=True)
            await a.send_typing(ev1.source.chat_id)
            card = await a.send_slash_confirm(ev1.source.chat_id, "Reload?", "", "sk", "sc-1")
            await a._close_card(card.message_id, a._cards[card.message_id])
            await a.send(ev2.source.chat_id, "answer")
            assert router.seen == [
                ("POST", "messages", TRACE), ("POST", "messages", TRACE), ("POST", "typing", TRACE),
                ("POST", "prompts", TRACE), ("DELETE", "prompts/" + card.message_id, TRACE),
                ("POST", "messages", None),
            ], router.seen
        finally:
            await hermes.stop()
            await router.stop()
    run(main())
