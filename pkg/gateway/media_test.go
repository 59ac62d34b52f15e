package gateway_test

// Audio and media over real sockets: the demo's answers to audio, the media
// echo (same bytes, kind, mime and filename), multi-part uploads assembled in
// index order, the 8 MiB limits at the boundary, the memory rules of
// multi-part uploads (8 open uploads, an 8 MiB buffer per device, at most
// 2048 parts, buffers freed on disconnect) and deduplication by id.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

const (
	mdMiB  = 1 << 20
	mdMax  = protocol.MaxMediaBytes // 8388608
	mdPart = protocol.MediaChunkBytes
)

// mdBytes returns n pseudo-random bytes, different for each seed.
func mdBytes(n int, seed uint64) []byte {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	p := make([]byte, n)
	rand.NewChaCha8(key).Read(p)
	return p
}

// mdMedia sends one media frame given as a map, so that any member can be
// left out or set to anything.
func mdSend(t testing.TB, c *client.Conn, frame map[string]any) {
	t.Helper()
	if err := c.Send(frame); err != nil {
		t.Fatalf("send %v: %v", frame["t"], err)
	}
}

// mdRaw is the JSON frame of fields plus data in base64, built without
// encoding/json for the data: several MiB go through it quickly even under
// the race detector.
func mdRaw(fields map[string]any, data []byte) []byte {
	b, err := json.Marshal(fields)
	if err != nil {
		panic(err)
	}
	b = append(b[:len(b)-1], `,"data":"`...)
	b = base64.StdEncoding.AppendEncode(b, data)
	return append(b, `"}`...)
}

// mdSendRaw sends a frame built by mdRaw.
func mdSendRaw(t testing.TB, c *client.Conn, frame []byte) {
	t.Helper()
	if err := c.SendRaw(frame); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// mdSendPart sends one part of a multi-part upload, part and parts set.
func mdSendPart(t testing.TB, c *client.Conn, id, kind string, data []byte, part, parts int) {
	t.Helper()
	mdSendRaw(t, c, mdRaw(map[string]any{
		"t": "media", "id": id, "kind": kind, "mime": "application/octet-stream", "filename": id + ".bin",
		"part": part, "parts": parts,
	}, data))
}

// mdReadMedia reads the next file the server sends, up to its final frame.
// Every media frame read must belong to it, no error frame may arrive, and
// the frames of other types (avatar, ...) are returned apart.
func mdReadMedia(t testing.TB, c *client.Conn) (media, other []client.Frame) {
	t.Helper()
	fs := mtReadUntil(t, c, "a media file", func(f client.Frame) bool {
		return f.T() == protocol.TypeMedia && f.Bool("final")
	})
	for _, f := range fs {
		switch f.T() {
		case protocol.TypeError:
			t.Fatalf("error frame while waiting for media: %s", f)
		case protocol.TypeMedia:
			if len(media) > 0 && f.Str("id") != media[0].Str("id") {
				t.Fatalf("media frames of two files, %q and %q, where one was due", media[0].Str("id"), f.Str("id"))
			}
			media = append(media, f)
		default:
			other = append(other, f)
		}
	}
	return media, other
}

// mdData decodes the data of one media frame.
func mdData(t testing.TB, f client.Frame) []byte {
	t.Helper()
	if !f.Has("data") {
		t.Fatalf("media frame without data: %.200s", f.String())
	}
	b, err := base64.StdEncoding.DecodeString(f.Str("data"))
	if err != nil {
		t.Fatalf("media data is not base64: %v", err)
	}
	return b
}

// mdExpectEcho reads the demo's echo of a file and checks it frame by frame:
// one id, kind, mime and filename as given, part 0..parts-1 in order, parts
// = ceil(size / 3 MiB), size the whole file on every frame, final only on
// the last, and the joined bytes equal data. It returns the first frame.
func mdExpectEcho(t testing.TB, c *client.Conn, kind, mime, filename string, data []byte) client.Frame {
	t.Helper()
	frames, _ := mdReadMedia(t, c)
	wantParts := max(1, (len(data)+mdPart-1)/mdPart)
	if len(frames) != wantParts {
		t.Fatalf("the echo of %d bytes came in %d frames, want %d", len(data), len(frames), wantParts)
	}
	var joined []byte
	for i, f := range frames {
		checks := []struct {
			name      string
			got, want any
		}{
			{"kind", f.Str("kind"), kind},
			{"mime", f.Str("mime"), mime},
			{"filename", f.Str("filename"), filename},
			{"part", f.Int("part"), i},
			{"parts", f.Int("parts"), wantParts},
			{"size", f.Int("size"), len(data)},
			{"final", f.Bool("final"), i == wantParts-1},
		}
		for _, ck := range checks {
			if ck.got != ck.want {
				t.Errorf("echo frame %d: %s = %v, want %v", i, ck.name, ck.got, ck.want)
			}
		}
		for _, k := range []string{"id", "kind", "mime", "filename", "part", "parts", "final", "size"} {
			if !f.Has(k) {
				t.Errorf("echo frame %d has no %s", i, k)
			}
		}
		chunk := mdData(t, f)
		if want := min(mdPart, len(data)-i*mdPart); len(chunk) != want {
			t.Errorf("echo frame %d carries %d bytes, want %d", i, len(chunk), want)
		}
		joined = append(joined, chunk...)
	}
	if !bytes.Equal(joined, data) {
		t.Fatalf("the echo's %d bytes differ from the %d bytes sent", len(joined), len(data))
	}
	return frames[0]
}

// mdAgentFile waits for the agent's media event id from dev and returns it
// with the bytes the agent can read from the store.
func mdAgentFile(t testing.TB, n *node, dev, id string) (wire.Event, []byte) {
	t.Helper()
	ev := n.agent.waitFor(t, func(ev wire.Event) bool {
		return ev.Kind == wire.EventMedia && ev.Device == dev && ev.ID == id
	})
	if ev.Media == nil {
		t.Fatalf("media event without media: %+v", ev)
	}
	data, err := n.Store.GetBlob(testCtx(t), ev.Media.Blob)
	if err != nil {
		t.Fatalf("the agent cannot read the file of %s: %v", id, err)
	}
	if len(data) != ev.Media.Size {
		t.Errorf("event %s says %d bytes, the blob has %d", id, ev.Media.Size, len(data))
	}
	return ev, data
}

// mdUploadBytes is what the store buffers for dev.
func mdUploadBytes(t testing.TB, n *node, dev string) int {
	t.Helper()
	b, err := n.Store.UploadBytes(testCtx(t), dev)
	if err != nil {
		t.Fatalf("UploadBytes: %v", err)
	}
	return b
}

// mdQuiet is the demo agent without the media echo: for tests that only
// need the upload side, sparing the socket (and the race detector) the
// decoding of megabytes that come back.
func mdQuiet(cfg *gateway.Config) { cfg.Agent = mdNoEcho{} }

type mdNoEcho struct{}

func (mdNoEcho) Handle(ctx context.Context, ev wire.Event, out agent.Output) error {
	if ev.Kind == wire.EventMedia {
		return nil
	}
	return agent.Demo{}.Handle(ctx, ev, out)
}

// ---- audio ----

// TestAudioAccepted: wav and ogg, in any case, reach the agent with their
// exact bytes, and the demo answers with the decoded size and the format,
// plus the recognised text when there is one.
func TestAudioAccepted(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-audio")
	cases := []struct {
		format, want string
		size         int
		text         string
	}{
		{"wav", "wav", 12345, ""},
		{"ogg", "ogg", 1, ""},
		{"WAV", "wav", 4096, ""},
		{"Ogg", "ogg", 777, "Привет, \"мир\" 🙂"},
		{"wav", "wav", 3, "turn on the lights"},
	}
	for i, tc := range cases {
		id := fmt.Sprintf("aud-%d", i)
		data := mdBytes(tc.size, uint64(i))
		if err := c.Audio(id, tc.format, data, tc.text); err != nil {
			t.Fatal(err)
		}
		r := mtReadReply(t, c)
		want := fmt.Sprintf("Received audio: %d bytes (%s)", tc.size, tc.want)
		if tc.text != "" {
			want += ". Recognised text: " + tc.text
		}
		if len(r.frames) != 1 {
			t.Fatalf("%s: the answer came in %d frames: %s", id, len(r.frames), mtDescribe(r.frames))
		}
		f := r.frames[0]
		if f.Str("text") != want {
			t.Errorf("%s (%s, %d bytes): answer %q, want %q", id, tc.format, tc.size, f.Str("text"), want)
		}
		if ch := f.Map("chunk"); ch.Int("index") != 0 || ch.Int("total") != 1 || !f.Bool("final") || f.Bool("edit") {
			t.Errorf("%s: a one-frame answer must be chunk 0 of 1, final, not an edit: %s", id, f)
		}
		ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == id })
		if ev.Kind != wire.EventAudio || ev.Format != tc.want || ev.Text != tc.text || ev.Media == nil || ev.Media.Size != tc.size {
			t.Fatalf("%s: the agent got %+v (media %+v)", id, ev, ev.Media)
		}
		got, err := n.Store.GetBlob(testCtx(t), ev.Media.Blob)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: the agent's audio bytes differ from those sent (err %v)", id, err)
		}
	}
}

// TestAudioInvalid: an unsupported format is unsupported_frame; a missing
// format, id or data, empty data and data that is not base64 are bad_frame;
// none is fatal and none reaches the agent.
func TestAudioInvalid(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-audio-bad")
	data := base64.StdEncoding.EncodeToString(mdBytes(100, 1))
	cases := []struct {
		name  string
		frame map[string]any
		code  protocol.Code
	}{
		{"mp3", map[string]any{"t": "audio", "id": "ab-1", "format": "mp3", "data": data}, protocol.CodeUnsupportedFrame},
		{"m4a", map[string]any{"t": "audio", "id": "ab-2", "format": "m4a", "data": data}, protocol.CodeUnsupportedFrame},
		{"missing format", map[string]any{"t": "audio", "id": "ab-3", "data": data}, protocol.CodeBadFrame},
		{"empty format", map[string]any{"t": "audio", "id": "ab-4", "format": "", "data": data}, protocol.CodeBadFrame},
		{"missing data", map[string]any{"t": "audio", "id": "ab-5", "format": "wav"}, protocol.CodeBadFrame},
		{"empty data", map[string]any{"t": "audio", "id": "ab-6", "format": "wav", "data": ""}, protocol.CodeBadFrame},
		{"invalid base64", map[string]any{"t": "audio", "id": "ab-7", "format": "wav", "data": "!!not base64!!"}, protocol.CodeBadFrame},
		{"data not a string", map[string]any{"t": "audio", "id": "ab-8", "format": "wav", "data": 12}, protocol.CodeBadFrame},
		{"missing id", map[string]any{"t": "audio", "format": "wav", "data": data}, protocol.CodeBadFrame},
	}
	for _, tc := range cases {
		mdSend(t, c, tc.frame)
		f := mtExpectError(t, c, tc.code)
		t.Logf("%s: %s", tc.name, f)
		mtAlive(t, c)
	}
	mtMarker(t, n, c, "tel-audio-bad")
	if got := n.agent.count(func(ev wire.Event) bool { return ev.Kind == wire.EventAudio }); got != 0 {
		t.Fatalf("the agent received %d invalid audio frames: %+v", got, n.agent.Events())
	}
}

// TestAudioLimit: exactly 8 MiB of decoded audio passes with its exact
// size; one byte more is too_big, not fatal, and never reaches the agent.
func TestAudioLimit(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-audio-max")
	data := mdBytes(protocol.MaxAudioBytes+1, 7)
	mdSendRaw(t, c, mdRaw(map[string]any{"t": "audio", "id": "big-ok", "format": "wav"}, data[:protocol.MaxAudioBytes]))
	r := mtReadReply(t, c)
	if got, want := r.frames[len(r.frames)-1].Str("text"), "Received audio: 8388608 bytes (wav)"; got != want {
		t.Fatalf("answer %q, want %q", got, want)
	}
	mdSendRaw(t, c, mdRaw(map[string]any{"t": "audio", "id": "big-over", "format": "ogg"}, data))
	mtExpectError(t, c, protocol.CodeTooBig)
	mtMarker(t, n, c, "tel-audio-max")
	if got := mtCountEvents(n, wire.EventAudio, "tel-audio-max", "big-over"); got != 0 {
		t.Fatalf("the agent received the audio over the limit")
	}
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "big-ok" })
	if ev.Media == nil || ev.Media.Size != protocol.MaxAudioBytes {
		t.Fatalf("the agent got %+v", ev.Media)
	}
}

// TestAudioDedup: an audio resent with the same id reaches the agent once
// and gets no answer and no error.
func TestAudioDedup(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-audio-dup")
	data := mdBytes(2000, 3)
	if err := c.Audio("voice-1", "ogg", data, "hello"); err != nil {
		t.Fatal(err)
	}
	mtReadReply(t, c)
	if err := c.Audio("voice-1", "ogg", data, "hello"); err != nil {
		t.Fatal(err)
	}
	if err := c.Audio("voice-1", "wav", data[:10], ""); err != nil {
		t.Fatal(err)
	}
	fs := mtMarker(t, n, c, "tel-audio-dup")
	mtCheckOnlyMarkerEcho(t, fs)
	if got := mtCountEvents(n, wire.EventAudio, "tel-audio-dup", "voice-1"); got != 1 {
		t.Fatalf("the agent received voice-1 %d times, want 1", got)
	}
}

// ---- media: single frame ----

// TestMediaEchoSingleFrame: each accepted kind comes back as one media frame
// with the same bytes, kind (audio as voice), mime, filename and caption,
// size the file's, part 0 of 1, final; the agent gets the file intact.
func TestMediaEchoSingleFrame(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-media")
	cases := []struct {
		kind, echoKind, mime, filename, caption string
		size                                    int
	}{
		{"image", "image", "image/png", "cat.png", "a cat", 5000},
		{"video", "video", "video/mp4", "clip.mp4", "", 70000},
		{"document", "document", "application/pdf", "Отчёт 2024 (final).pdf", "see page 3", 1},
		{"audio", "voice", "audio/ogg", "note.ogg", "", 4321},
	}
	for i, tc := range cases {
		id := fmt.Sprintf("up-%d", i)
		data := mdBytes(tc.size, uint64(100+i))
		err := c.Media(client.MediaUp{ID: id, Kind: tc.kind, Mime: tc.mime, Filename: tc.filename, Caption: tc.caption, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		first := mdExpectEcho(t, c, tc.echoKind, tc.mime, tc.filename, data)
		if got := first.Str("caption"); got != tc.caption {
			t.Errorf("%s: echo caption %q, want %q", id, got, tc.caption)
		}
		if got := first.Str("reply_to"); got != id {
			t.Errorf("%s: echo reply_to %q, want the upload's id", id, got)
		}
		ev, got := mdAgentFile(t, n, "tel-media", id)
		m := ev.Media
		if m.Kind != tc.kind || m.Mime != tc.mime || m.Filename != tc.filename || m.Caption != tc.caption || m.Size != tc.size {
			t.Errorf("%s: the agent got %+v", id, m)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: the agent's bytes differ from those sent", id)
		}
	}
}

// TestMediaInvalid: kinds the app may not upload (voice, sticker, ...) are
// unsupported_frame; a missing kind, id or data, empty or non-base64 data
// are bad_frame; a caption over 12000 characters is too_big. None is fatal
// and none reaches the agent; a caption of exactly 12000 passes.
func TestMediaInvalid(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-media-bad")
	data := base64.StdEncoding.EncodeToString(mdBytes(64, 9))
	cases := []struct {
		name  string
		frame map[string]any
		code  protocol.Code
	}{
		{"voice", map[string]any{"t": "media", "id": "mb-1", "kind": "voice", "data": data}, protocol.CodeUnsupportedFrame},
		{"sticker", map[string]any{"t": "media", "id": "mb-2", "kind": "sticker", "data": data}, protocol.CodeUnsupportedFrame},
		{"animation", map[string]any{"t": "media", "id": "mb-3", "kind": "animation", "data": data}, protocol.CodeUnsupportedFrame},
		{"multi-part voice", map[string]any{"t": "media", "id": "mb-4", "kind": "voice", "data": data, "part": 0, "parts": 2}, protocol.CodeUnsupportedFrame},
		{"missing kind", map[string]any{"t": "media", "id": "mb-5", "data": data}, protocol.CodeBadFrame},
		{"missing data", map[string]any{"t": "media", "id": "mb-6", "kind": "image"}, protocol.CodeBadFrame},
		{"empty data", map[string]any{"t": "media", "id": "mb-7", "kind": "image", "data": ""}, protocol.CodeBadFrame},
		{"invalid base64", map[string]any{"t": "media", "id": "mb-8", "kind": "image", "data": "%%% nope %%%"}, protocol.CodeBadFrame},
		{"missing id", map[string]any{"t": "media", "kind": "image", "data": data}, protocol.CodeBadFrame},
		{"caption 12001", map[string]any{"t": "media", "id": "mb-9", "kind": "image", "data": data, "caption": mtLongText(12001)}, protocol.CodeTooBig},
	}
	for _, tc := range cases {
		mdSend(t, c, tc.frame)
		f := mtExpectError(t, c, tc.code)
		t.Logf("%s: %s", tc.name, f)
		mtAlive(t, c)
	}
	mtMarker(t, n, c, "tel-media-bad")
	if got := n.agent.count(func(ev wire.Event) bool { return ev.Kind == wire.EventMedia }); got != 0 {
		t.Fatalf("the agent received %d invalid media frames", got)
	}
	caption := mtLongText(protocol.MaxTextChars)
	file := mdBytes(10, 10)
	if err := c.Media(client.MediaUp{ID: "mb-ok", Kind: "image", Mime: "image/gif", Filename: "x.gif", Caption: caption, Data: file}); err != nil {
		t.Fatal(err)
	}
	first := mdExpectEcho(t, c, "image", "image/gif", "x.gif", file)
	if first.Str("caption") != caption {
		t.Errorf("a 12000-character caption did not come back intact")
	}
	if ev, _ := mdAgentFile(t, n, "tel-media-bad", "mb-ok"); ev.Media.Caption != caption {
		t.Errorf("the agent did not get the 12000-character caption intact")
	}
}

// TestMediaMimeFromFilename: an empty mime is derived from the filename's
// extension; a given mime is kept as is.
func TestMediaMimeFromFilename(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-mime")
	cases := []struct{ mime, filename, want string }{
		{"", "a.png", "image/png"},
		{"", "photo.jpg", "image/jpeg"},
		{"", "PHOTO.JPG", "image/jpeg"},
		{"", "report.pdf", "application/pdf"},
		{"image/webp", "a.png", "image/webp"},
	}
	for i, tc := range cases {
		id := fmt.Sprintf("mime-%d", i)
		data := mdBytes(300, uint64(i))
		if err := c.Media(client.MediaUp{ID: id, Kind: "image", Mime: tc.mime, Filename: tc.filename, Data: data}); err != nil {
			t.Fatal(err)
		}
		mdExpectEcho(t, c, "image", tc.want, tc.filename, data)
		if ev, _ := mdAgentFile(t, n, "tel-mime", id); ev.Media.Mime != tc.want {
			t.Errorf("%s: the agent got mime %q, want %q", tc.filename, ev.Media.Mime, tc.want)
		}
	}
	// Without a filename the file still comes back with a name and a mime.
	data := mdBytes(50, 50)
	if err := c.Media(client.MediaUp{ID: "mime-noname", Kind: "document", Data: data}); err != nil {
		t.Fatal(err)
	}
	frames, _ := mdReadMedia(t, c)
	if f := frames[0]; f.Str("filename") == "" || f.Str("mime") == "" || !bytes.Equal(mdData(t, f), data) {
		t.Errorf("a file without filename and mime came back as %.300s", f.String())
	} else {
		t.Logf("no filename, no mime: echoed as filename %q, mime %q", f.Str("filename"), f.Str("mime"))
	}
}

// TestMediaFilenameTruncated: a filename is cut to its first 200 code
// points; one of exactly 200 is kept.
func TestMediaFilenameTruncated(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-fname")
	exact := strings.Repeat("ф", 196) + ".png" // 200 code points
	long := strings.Repeat("ф", 199) + "Ω-tail-that-goes.png"
	cases := []struct{ id, filename, want string }{
		{"fn-exact", exact, exact},
		{"fn-long", long, strings.Repeat("ф", 199) + "Ω"},
	}
	for i, tc := range cases {
		data := mdBytes(100, uint64(i))
		if err := c.Media(client.MediaUp{ID: tc.id, Kind: "document", Mime: "application/x-test", Filename: tc.filename, Data: data}); err != nil {
			t.Fatal(err)
		}
		mdExpectEcho(t, c, "document", "application/x-test", tc.want, data)
		if ev, _ := mdAgentFile(t, n, "tel-fname", tc.id); ev.Media.Filename != tc.want {
			t.Errorf("%s: the agent got filename of %d code points, want %d", tc.id, utf8.RuneCountInString(ev.Media.Filename), utf8.RuneCountInString(tc.want))
		}
	}
	// An empty mime is derived from the name the phone sent: cutting a long
	// name must not lose its extension's type.
	name := strings.Repeat("a", 210) + ".png"
	data := []byte("png?")
	if err := c.Media(client.MediaUp{ID: "fn-mime", Kind: "image", Filename: name, Data: data}); err != nil {
		t.Fatal(err)
	}
	mdExpectEcho(t, c, "image", "image/png", name[:200], data)
}

// TestMediaSingleFrameLimit: one frame of exactly 8 MiB passes (and comes
// back in 3 MiB chunks); 8 MiB + 1 is too_big, not fatal, never delivered.
func TestMediaSingleFrameLimit(t *testing.T) {
	n := startNode(t, mdQuiet) // TestMediaLargeEcho covers the 8 MiB echo
	c, _ := n.connect(t, "tel-media-max")
	data := mdBytes(mdMax+1, 11)
	mdSendRaw(t, c, mdRaw(map[string]any{"t": "media", "id": "max-ok", "kind": "video", "mime": "video/mp4", "filename": "max.mp4"}, data[:mdMax]))
	mtAlive(t, c)
	if ev, got := mdAgentFile(t, n, "tel-media-max", "max-ok"); ev.Media.Size != mdMax || !bytes.Equal(got, data[:mdMax]) {
		t.Fatalf("the agent got %d bytes, want the 8388608 sent", ev.Media.Size)
	}
	mdSendRaw(t, c, mdRaw(map[string]any{"t": "media", "id": "max-over", "kind": "video", "mime": "video/mp4", "filename": "over.mp4"}, data))
	mtExpectError(t, c, protocol.CodeTooBig)
	mtMarker(t, n, c, "tel-media-max")
	if got := mtCountEvents(n, wire.EventMedia, "tel-media-max", "max-over"); got != 0 {
		t.Fatalf("the agent received the file over the limit")
	}
}

// ---- media: multi-part ----

// TestMediaMultipart: a file sent in 3 parts reaches the agent as one media
// event with the whole file, and its echo carries the same bytes.
func TestMediaMultipart(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-multi")
	data := mdBytes(25000, 21)
	if err := c.UploadFile("multi-1", "image", "image/jpeg", "big.jpg", "three parts", data, 10000); err != nil {
		t.Fatal(err)
	}
	first := mdExpectEcho(t, c, "image", "image/jpeg", "big.jpg", data)
	if first.Str("caption") != "three parts" {
		t.Errorf("caption %q", first.Str("caption"))
	}
	ev, got := mdAgentFile(t, n, "tel-multi", "multi-1")
	if ev.Media.Size != len(data) || !bytes.Equal(got, data) || ev.Media.Filename != "big.jpg" || ev.Media.Kind != "image" {
		t.Fatalf("the agent got %+v, want the whole file of %d bytes", ev.Media, len(data))
	}
	mtMarker(t, n, c, "tel-multi")
	if got := mtCountEvents(n, wire.EventMedia, "tel-multi", "multi-1"); got != 1 {
		t.Fatalf("the agent got %d media events for one file in 3 parts", got)
	}
	if b := mdUploadBytes(t, n, "tel-multi"); b != 0 {
		t.Fatalf("%d bytes stay buffered after the file completed", b)
	}
}

// TestMediaMultipartOutOfOrder: parts sent as 2, 0, 1 are assembled in index
// order.
func TestMediaMultipartOutOfOrder(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-ooo")
	parts := [][]byte{mdBytes(7000, 31), mdBytes(7000, 32), mdBytes(1234, 33)}
	for _, i := range []int{2, 0, 1} {
		err := c.Media(client.MediaUp{ID: "ooo", Kind: "document", Mime: "application/zip", Filename: "a.zip", Data: parts[i], Part: i, Parts: 3})
		if err != nil {
			t.Fatal(err)
		}
	}
	data := bytes.Join(parts, nil)
	mdExpectEcho(t, c, "document", "application/zip", "a.zip", data)
	if _, got := mdAgentFile(t, n, "tel-ooo", "ooo"); !bytes.Equal(got, data) {
		t.Fatalf("the agent's file is not the parts in index order")
	}
}

// TestMediaLargeEcho: an 8 MiB file uploaded in 3 MiB parts comes back as 3
// frames of 3, 3 and 2 MiB, part 0..2 of 3, size 8388608 on each, final
// only on the last; the bytes are the same.
func TestMediaLargeEcho(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-large")
	data := mdBytes(mdMax, 41)
	if err := c.UploadFile("large-1", "video", "video/webm", "movie.webm", "", data, 0); err != nil {
		t.Fatal(err)
	}
	frames, _ := mdReadMedia(t, c)
	sizes := []int{3 * mdMiB, 3 * mdMiB, 2 * mdMiB}
	if len(frames) != 3 {
		t.Fatalf("the echo came in %d frames, want 3", len(frames))
	}
	var joined []byte
	for i, f := range frames {
		chunk := mdData(t, f)
		if len(chunk) != sizes[i] || f.Int("part") != i || f.Int("parts") != 3 || f.Int("size") != mdMax ||
			f.Bool("final") != (i == 2) || f.Str("id") != frames[0].Str("id") ||
			f.Str("kind") != "video" || f.Str("mime") != "video/webm" || f.Str("filename") != "movie.webm" {
			t.Errorf("frame %d: %d bytes, part %d of %d, size %d, final %v, kind %q, mime %q, filename %q",
				i, len(chunk), f.Int("part"), f.Int("parts"), f.Int("size"), f.Bool("final"), f.Str("kind"), f.Str("mime"), f.Str("filename"))
		}
		joined = append(joined, chunk...)
	}
	if !bytes.Equal(joined, data) {
		t.Fatalf("the reassembled echo differs from the file")
	}
	if ev, _ := mdAgentFile(t, n, "tel-large", "large-1"); ev.Media.Size != mdMax {
		t.Fatalf("the agent got %d bytes", ev.Media.Size)
	}
}

// TestMediaMultipartFileTooBig: parts adding up to more than 8 MiB are
// too_big, the upload is dropped and the agent gets nothing.
func TestMediaMultipartFileTooBig(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-toobig")
	half := mdBytes(4*mdMiB, 51)
	mdSendPart(t, c, "tb", "video", half, 0, 3)
	mdSendPart(t, c, "tb", "video", half, 1, 3)
	mtAlive(t, c)
	mdSendPart(t, c, "tb", "video", []byte{1}, 2, 3)
	mtExpectError(t, c, protocol.CodeTooBig)
	if b := mdUploadBytes(t, n, "tel-toobig"); b != 0 {
		t.Errorf("%d bytes stay buffered for a file refused as too big", b)
	}
	mtMarker(t, n, c, "tel-toobig")
	if got := mtCountEvents(n, wire.EventMedia, "tel-toobig", "tb"); got != 0 {
		t.Fatalf("the agent received a file of more than 8 MiB")
	}
}

// ---- upload memory rules ----

// TestUploadOpenLimit: 8 unfinished uploads of one device are accepted, a
// 9th is too_big and not kept, and the first 8 can still be completed.
func TestUploadOpenLimit(t *testing.T) {
	n := startNode(t, nil)
	const dev = "tel-open"
	c, _ := n.connect(t, dev)
	files := make([][]byte, 9)
	for i := range files {
		files[i] = mdBytes(200, uint64(60+i))
	}
	for i := range protocol.MaxOpenUploads {
		mdSendPart(t, c, fmt.Sprintf("open-%d", i), "document", files[i][:100], 0, 2)
	}
	mtAlive(t, c) // no error for any of the 8
	if b := mdUploadBytes(t, n, dev); b != 8*100 {
		t.Fatalf("%d bytes buffered for 8 open uploads of 100 bytes", b)
	}
	mdSendPart(t, c, "open-8", "document", files[8][:100], 0, 2)
	mtExpectError(t, c, protocol.CodeTooBig)
	if b := mdUploadBytes(t, n, dev); b != 8*100 {
		t.Fatalf("%d bytes buffered after the 9th upload was refused, want 800", b)
	}
	// Complete the first 8.
	for i := range protocol.MaxOpenUploads {
		id := fmt.Sprintf("open-%d", i)
		mdSendPart(t, c, id, "document", files[i][100:], 1, 2)
		frames, _ := mdReadMedia(t, c)
		if got := mdData(t, frames[0]); !bytes.Equal(got, files[i]) {
			t.Fatalf("%s came back with other bytes", id)
		}
		if _, got := mdAgentFile(t, n, dev, id); !bytes.Equal(got, files[i]) {
			t.Fatalf("the agent got other bytes for %s", id)
		}
	}
	if b := mdUploadBytes(t, n, dev); b != 0 {
		t.Fatalf("%d bytes buffered after all uploads completed", b)
	}
	// The refused 9th kept nothing: its second part alone does not complete it.
	mdSendPart(t, c, "open-8", "document", files[8][100:], 1, 2)
	mtAlive(t, c)
	if b := mdUploadBytes(t, n, dev); b != 100 {
		t.Fatalf("%d bytes buffered, want only the 100 of open-8's second part", b)
	}
	mtMarker(t, n, c, dev)
	if got := mtCountEvents(n, wire.EventMedia, dev, "open-8"); got != 0 {
		t.Fatalf("the refused upload was delivered: its first part was kept")
	}
}

// TestUploadBufferLimit: open uploads of one device summing exactly 8 MiB
// are accepted; one byte more is too_big and that buffer is not kept; the
// open uploads can still be completed.
func TestUploadBufferLimit(t *testing.T) {
	n := startNode(t, mdQuiet)
	const dev = "tel-buffer"
	c, _ := n.connect(t, dev)
	a := mdBytes(5*mdMiB+10, 71) // part 0: 5 MiB, part 1: 10 bytes
	b := mdBytes(3*mdMiB+20, 72) // part 0: 3 MiB, part 1: 20 bytes
	mdSendPart(t, c, "buf-a", "video", a[:5*mdMiB], 0, 2)
	mdSendPart(t, c, "buf-b", "video", b[:3*mdMiB], 0, 2)
	mtAlive(t, c)
	if got := mdUploadBytes(t, n, dev); got != mdMax {
		t.Fatalf("%d bytes buffered, want exactly 8388608", got)
	}
	mdSendPart(t, c, "buf-c", "video", []byte{0xAB}, 0, 2)
	mtExpectError(t, c, protocol.CodeTooBig)
	if got := mdUploadBytes(t, n, dev); got != mdMax {
		t.Fatalf("%d bytes buffered after the refused byte, want 8388608", got)
	}
	// The open uploads complete: a completing part is not buffered.
	mdSendPart(t, c, "buf-a", "video", a[5*mdMiB:], 1, 2)
	mdSendPart(t, c, "buf-b", "video", b[3*mdMiB:], 1, 2)
	mtAlive(t, c)
	for id, want := range map[string][]byte{"buf-a": a, "buf-b": b} {
		if _, got := mdAgentFile(t, n, dev, id); !bytes.Equal(got, want) {
			t.Fatalf("the agent got other bytes for %s", id)
		}
	}
	if got := mdUploadBytes(t, n, dev); got != 0 {
		t.Fatalf("%d bytes buffered after both uploads completed", got)
	}
	// buf-c's refused first part was not kept: its second part alone does
	// not complete it.
	mdSendPart(t, c, "buf-c", "video", []byte{0xCD}, 1, 2)
	mtAlive(t, c)
	if got := mdUploadBytes(t, n, dev); got != 1 {
		t.Fatalf("%d bytes buffered, want only the 1 of buf-c's second part", got)
	}
	mtMarker(t, n, c, dev)
	if got := mtCountEvents(n, wire.EventMedia, dev, "buf-c"); got != 0 {
		t.Fatalf("the refused upload was delivered")
	}
}

// TestUploadPartsBounds: parts may be 1..2048 and part 0..parts-1; anything
// else is bad_frame. A file in 2048 parts, sent last part first, arrives
// assembled in index order.
func TestUploadPartsBounds(t *testing.T) {
	n := startNode(t, nil)
	const dev = "tel-parts"
	c, _ := n.connect(t, dev)
	one := base64.StdEncoding.EncodeToString([]byte{1})
	bad := []struct {
		name  string
		frame map[string]any
	}{
		{"parts 2049", map[string]any{"t": "media", "id": "pb-1", "kind": "image", "data": one, "part": 0, "parts": 2049}},
		{"parts 0", map[string]any{"t": "media", "id": "pb-2", "kind": "image", "data": one, "part": 0, "parts": 0}},
		{"parts -1", map[string]any{"t": "media", "id": "pb-3", "kind": "image", "data": one, "part": 0, "parts": -1}},
		{"part = parts", map[string]any{"t": "media", "id": "pb-4", "kind": "image", "data": one, "part": 2, "parts": 2}},
		{"part 2048 of 2048", map[string]any{"t": "media", "id": "pb-5", "kind": "image", "data": one, "part": 2048, "parts": 2048}},
		{"part -1", map[string]any{"t": "media", "id": "pb-6", "kind": "image", "data": one, "part": -1, "parts": 2}},
		{"part 1 without parts", map[string]any{"t": "media", "id": "pb-7", "kind": "image", "data": one, "part": 1}},
	}
	for _, tc := range bad {
		mdSend(t, c, tc.frame)
		f := mtExpectError(t, c, protocol.CodeBadFrame)
		t.Logf("%s: %s", tc.name, f)
		mtAlive(t, c)
	}
	if got := mdUploadBytes(t, n, dev); got != 0 {
		t.Fatalf("%d bytes buffered for refused parts", got)
	}

	const parts = protocol.MaxMediaParts // 2048
	data := mdBytes(parts, 81)
	for i := parts - 1; i >= 0; i-- {
		mdSendPart(t, c, "p2048", "document", data[i:i+1], i, parts)
		if i == parts-1 {
			mtAlive(t, c) // the first part of 2048 is accepted
			if got := mdUploadBytes(t, n, dev); got != 1 {
				t.Fatalf("%d bytes buffered after one part of 2048", got)
			}
		}
	}
	frames, other := mdReadMedia(t, c)
	mtNoErrors(t, other, "2048 parts")
	if got := mdData(t, frames[0]); !bytes.Equal(got, data) {
		t.Fatalf("a file of 2048 one-byte parts came back with other bytes")
	}
	if _, got := mdAgentFile(t, n, dev, "p2048"); !bytes.Equal(got, data) {
		t.Fatalf("the agent's file of 2048 parts is not in index order")
	}
	mtMarker(t, n, c, dev)
	for _, ev := range n.agent.Events() {
		if ev.Kind == wire.EventMedia && ev.ID != "p2048" {
			t.Errorf("the agent received a refused part: %+v", ev)
		}
	}
}

// TestUploadPartsMismatch: a part whose parts count differs from the earlier
// chunks of the same id is bad_frame.
func TestUploadPartsMismatch(t *testing.T) {
	n := startNode(t, nil)
	data := mdBytes(300, 91)
	cases := []struct {
		name string
		// first opens the upload "mm" with parts 3; second is the part
		// that disagrees.
		first  []byte
		second []byte
	}{
		{"parts 3 then 4",
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image", "part": 0, "parts": 3}, data[:100]),
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image", "part": 1, "parts": 4}, data[100:200])},
		{"parts 3 then 2, which it would complete",
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image", "part": 0, "parts": 3}, data[:100]),
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image", "part": 1, "parts": 2}, data[100:200])},
		{"parts 3 then 1",
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image", "part": 1, "parts": 3}, data[:100]),
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image", "part": 0, "parts": 1}, data[100:200])},
		{"parts 3 then none (default 1)",
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image", "part": 1, "parts": 3}, data[:100]),
			mdRaw(map[string]any{"t": "media", "id": "mm", "kind": "image"}, data[100:200])},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev := fmt.Sprintf("tel-mismatch-%d", i)
			c, _ := n.connect(t, dev)
			mdSendRaw(t, c, tc.first)
			mtAlive(t, c)
			mdSendRaw(t, c, tc.second)
			mtExpectError(t, c, protocol.CodeBadFrame)
			mtMarker(t, n, c, dev)
			if got := mtCountEvents(n, wire.EventMedia, dev, "mm"); got != 0 {
				t.Fatalf("the agent received a file from mismatching parts")
			}
			t.Logf("after the mismatch %d bytes stay buffered", mdUploadBytes(t, n, dev))
		})
	}
}

// TestUploadFreedOnDisconnect: a device's unfinished buffers are freed when
// its connection drops.
func TestUploadFreedOnDisconnect(t *testing.T) {
	n := startNode(t, nil)
	const dev = "tel-drop"
	c, _ := n.connect(t, dev)
	mdSendPart(t, c, "drop-1", "video", mdBytes(mdMiB, 1), 0, 2)
	mdSendPart(t, c, "drop-2", "video", mdBytes(1000, 2), 1, 3)
	mtAlive(t, c)
	if got := mdUploadBytes(t, n, dev); got != mdMiB+1000 {
		t.Fatalf("%d bytes buffered, want %d", got, mdMiB+1000)
	}
	c.CloseNow()
	testsvc.WaitFor(t, 3*time.Second, "the upload's buffered bytes to be freed after the device disconnected",
		func() bool { return mdUploadBytes(t, n, dev) == 0 })
}

// TestMediaDedup: a media id is delivered once: a single-frame file resent,
// and a multi-part file resent in full after it completed (judged by the
// whole file), reach the agent once, without an answer or an error. A part
// repeated within an upload does not make the file a duplicate.
func TestMediaDedup(t *testing.T) {
	n := startNode(t, nil)
	const dev = "tel-media-dup"
	c, _ := n.connect(t, dev)
	single := mdBytes(500, 1)
	up := client.MediaUp{ID: "dup-single", Kind: "image", Mime: "image/png", Filename: "s.png", Data: single}
	if err := c.Media(up); err != nil {
		t.Fatal(err)
	}
	mdExpectEcho(t, c, "image", "image/png", "s.png", single)
	if err := c.Media(up); err != nil {
		t.Fatal(err)
	}
	mtCheckOnlyMarkerEcho(t, mdNoMedia(t, mtMarker(t, n, c, dev)))
	if got := mtCountEvents(n, wire.EventMedia, dev, "dup-single"); got != 1 {
		t.Fatalf("the agent received dup-single %d times", got)
	}

	multi := mdBytes(30000, 2)
	if err := c.UploadFile("dup-multi", "document", "application/pdf", "m.pdf", "", multi, 12000); err != nil {
		t.Fatal(err)
	}
	mdExpectEcho(t, c, "document", "application/pdf", "m.pdf", multi)
	if err := c.UploadFile("dup-multi", "document", "application/pdf", "m.pdf", "", multi, 12000); err != nil {
		t.Fatal(err)
	}
	mtCheckOnlyMarkerEcho(t, mdNoMedia(t, mtMarker(t, n, c, dev)))
	if got := mtCountEvents(n, wire.EventMedia, dev, "dup-multi"); got != 1 {
		t.Fatalf("the agent received dup-multi %d times", got)
	}
	// A lone part of the delivered file is not buffered either.
	mdSendPart(t, c, "dup-multi", "document", multi[:12000], 0, 3)
	mtAlive(t, c)
	if got := mdUploadBytes(t, n, dev); got != 0 {
		t.Errorf("%d bytes buffered for a part of a file already delivered", got)
	}

	// A chunk sent twice during the upload is not a duplicate file.
	rep := mdBytes(2000, 3)
	mdSendPart(t, c, "dup-chunk", "document", rep[:1000], 0, 2)
	mdSendPart(t, c, "dup-chunk", "document", rep[:1000], 0, 2)
	mdSendPart(t, c, "dup-chunk", "document", rep[1000:], 1, 2)
	frames, _ := mdReadMedia(t, c)
	if !bytes.Equal(mdData(t, frames[0]), rep) {
		t.Fatalf("a file with a repeated chunk came back with other bytes")
	}
	mtMarker(t, n, c, dev)
	if got := mtCountEvents(n, wire.EventMedia, dev, "dup-chunk"); got != 1 {
		t.Fatalf("the agent received dup-chunk %d times", got)
	}
}

// mdNoMedia fails the test if fs holds a media frame and returns fs.
func mdNoMedia(t testing.TB, fs []client.Frame) []client.Frame {
	t.Helper()
	for _, f := range fs {
		if f.T() == protocol.TypeMedia {
			t.Fatalf("a duplicate upload was answered with media %q", f.Str("id"))
		}
	}
	return fs
}
