"""Files both ways: uploads fetched by reference and cached, files sent to the phone."""

import base64
import os
from pathlib import Path

from conftest import Hermes, Phone, device_id, run

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def test_uploads_are_fetched_and_cached(tmp_path):
    async def main():
        from gateway.platforms import base

        dev = device_id("up")
        hermes = await Hermes(tmp_path).start()
        try:
            async with Phone(dev) as phone:
                await phone.media("f-1", "image", PNG, "photo.png", caption="look", mime="image/png")
                ev = await hermes.next_event(dev)
                assert ev.message_type.value == "photo" and ev.text == "look" and ev.message_id == "f-1"
                assert ev.media_types == ["image/png"]
                assert Path(ev.media_urls[0]).read_bytes() == PNG
                assert ("cache_image", ev.media_urls[0]) in base.calls

                doc = b"%PDF-1.4 report"
                await phone.media("f-2", "document", doc, "report.pdf")
                ev = await hermes.next_event(dev)
                assert ev.message_type.value == "document"
                assert Path(ev.media_urls[0]).read_bytes() == doc
                assert ev.media_urls[0].endswith("_report.pdf")

                # An "image" that is not one is kept as a document, not lost.
                await phone.media("f-3", "image", b"<html>nope</html>", "fake.jpg")
                ev = await hermes.next_event(dev)
                assert ev.message_type.value == "document"
                assert Path(ev.media_urls[0]).read_bytes() == b"<html>nope</html>"

                await phone.media("f-4", "video", b"\x00\x00\x00\x18ftypmp42", "clip.mp4")
                ev = await hermes.next_event(dev)
                assert ev.message_type.value == "video" and ev.media_urls[0].endswith(".mp4")

                ogg = b"OggS" + b"\x01" * 500
                await phone.send(t="audio", id="a-1", format="ogg", data=base64.b64encode(ogg).decode(),
                                 text="call mum")
                ev = await hermes.next_event(dev)
                assert ev.message_type.value == "voice" and ev.text == "call mum"
                assert ev.media_urls[0].endswith(".ogg") and Path(ev.media_urls[0]).read_bytes() == ogg
        finally:
            await hermes.stop()

    run(main())


def test_files_reach_the_phone(tmp_path):
    async def main():
        dev = device_id("down")
        hermes = await Hermes(tmp_path).start()
        a = hermes.adapter
        files = {}
        for name, data in (("chart.png", PNG), ("note.ogg", b"OggS" + b"\x02" * 64),
                           ("clip.mp4", b"\x00\x00\x00\x18ftyp"), ("data.csv", b"a,b\n1,2\n")):
            files[name] = tmp_path / name
            files[name].write_bytes(data)
        try:
            async with Phone(dev) as phone:
                sends = [
                    (a.send_image_file(dev, str(files["chart.png"]), caption="This week"), "image", "chart.png"),
                    (a.send_voice(dev, str(files["note.ogg"])), "voice", "note.ogg"),
                    (a.send_video(dev, str(files["clip.mp4"]), reply_to="f-1"), "video", "clip.mp4"),
                    (a.send_document(dev, str(files["data.csv"]), file_name="numbers.csv"), "document", "numbers.csv"),
                ]
                for call, kind, filename in sends:
                    res = await call
                    assert res.success, res.error
                    f = await phone.expect(lambda f: f["t"] == "media")
                    assert (f["id"], f["kind"], f["filename"]) == (res.message_id, kind, filename)
                    src = files["data.csv" if filename == "numbers.csv" else filename]
                    assert base64.b64decode(f["data"]) == src.read_bytes()
                    if kind == "image":
                        assert f["caption"] == "This week" and f["mime"] == "image/png"
                    if kind == "video":
                        assert f["reply_to"] == "f-1"

                res = await a.send_image(dev, "https://example.com/cat.gif?x=1", caption="cat")
                assert res.success
                f = await phone.expect(lambda f: f["t"] == "media")
                assert (f["kind"], f["url"], f["caption"]) == ("image", "https://example.com/cat.gif?x=1", "cat")

                # 8 MiB is the limit either way: one byte over is refused before it is read or sent.
                big = tmp_path / "big.bin"
                with open(big, "wb") as fh:
                    fh.truncate(8 * 1024 * 1024 + 1)
                res = await a.send_document(dev, str(big))
                assert not res.success and "8388608" in res.error and not res.retryable
                exact = tmp_path / "exact.bin"
                with open(exact, "wb") as fh:
                    fh.truncate(8 * 1024 * 1024)
                res = await a.send_document(dev, str(exact))
                assert res.success, res.error
                f = await phone.expect(lambda f: f["t"] == "media" and f["id"] == res.message_id, timeout=30)
                assert f["size"] == 8 * 1024 * 1024  # the first part of the whole file

                res = await a.send_document(dev, str(tmp_path / "missing.txt"))
                assert not res.success
        finally:
            await hermes.stop()

    run(main())
