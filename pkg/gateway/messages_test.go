package gateway_test

// Text messages over real sockets: the demo echo and its streaming (one id,
// a first message, edits, a final edit), the 12000-character limit, the
// chunking of long agent messages into frames of at most 3500 characters,
// the validation of text frames, the 128-character id and deduplication by
// <chat_id>:<id>.
//
// The helpers prefixed mt are shared with media_test.go.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// mtSeq makes ping timestamps and marker ids unique within the test binary.
var mtSeq atomic.Int64

// mtReadUntil reads frames until stop accepts one and returns every frame
// read, the accepted one last. A close, the end of the connection, a frame
// that is not a JSON object or a timeout fails the test.
func mtReadUntil(t testing.TB, c *client.Conn, what string, stop func(client.Frame) bool) []client.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var got []client.Frame
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v (read before: %s)", what, err, mtDescribe(got))
		}
		if ci := f.Close(); ci != nil {
			t.Fatalf("waiting for %s: the server closed the connection (%s) after %s", what, ci, mtDescribe(got))
		}
		got = append(got, f)
		if stop(f) {
			return got
		}
	}
}

// mtDescribe lists frames briefly for failure messages.
func mtDescribe(fs []client.Frame) string {
	if len(fs) == 0 {
		return "nothing"
	}
	var b strings.Builder
	for i, f := range fs {
		if i > 0 {
			b.WriteString(", ")
		}
		s := f.String()
		if len(s) > 160 {
			s = s[:160] + "..."
		}
		b.WriteString(s)
	}
	return b.String()
}

// mtNoErrors fails the test if fs holds an error frame.
func mtNoErrors(t testing.TB, fs []client.Frame, why string) {
	t.Helper()
	for _, f := range fs {
		if f.T() == protocol.TypeError {
			t.Fatalf("%s: unexpected error frame %s", why, f)
		}
	}
}

// mtExpectError checks that the frame just sent was answered with exactly
// one error frame carrying code, not fatal and with a message, and that the
// connection survived it. It sends a ping right after: the edge handles a
// connection's frames in order, so the error must come before the pong, and
// a pong without an error before it fails at once instead of waiting.
func mtExpectError(t testing.TB, c *client.Conn, code protocol.Code) client.Frame {
	t.Helper()
	ts := fmt.Sprintf("after-error-%d", mtSeq.Add(1))
	if err := c.Ping(ts); err != nil {
		t.Fatalf("ping: %v", err)
	}
	fs := mtReadUntil(t, c, "error "+string(code)+" and pong "+ts, func(f client.Frame) bool {
		return f.T() == protocol.TypePong && f.Str("ts") == ts
	})
	var errs []client.Frame
	for _, f := range fs {
		if f.T() == protocol.TypeError {
			errs = append(errs, f)
		}
	}
	if len(errs) != 1 {
		t.Fatalf("want one error %s, got %d error frames: %s", code, len(errs), mtDescribe(fs))
	}
	f := errs[0]
	if got := protocol.Code(f.Str("code")); got != code {
		t.Fatalf("error code = %q, want %q: %s", got, code, f)
	}
	if !f.Has("fatal") || f.Bool("fatal") {
		t.Fatalf("error %s must carry fatal:false: %s", code, f)
	}
	if f.Str("message") == "" {
		t.Errorf("error %s has no message: %s", code, f)
	}
	return f
}

// mtAlive proves the connection still works: a ping must be answered by a
// pong with the same ts, and no error frame may arrive before it. As the
// edge handles one connection's frames in order, it is also a barrier:
// everything sent before was handled. It returns the frames before the pong.
func mtAlive(t testing.TB, c *client.Conn) []client.Frame {
	t.Helper()
	ts := fmt.Sprintf("alive-%d", mtSeq.Add(1))
	if err := c.Ping(ts); err != nil {
		t.Fatalf("ping: %v", err)
	}
	fs := mtReadUntil(t, c, "pong "+ts, func(f client.Frame) bool {
		return f.T() == protocol.TypePong && f.Str("ts") == ts
	})
	mtNoErrors(t, fs, "before pong")
	return fs[:len(fs)-1]
}

// mtMarker sends a text marker with a fresh id on c (device dev) and waits
// until the agent received it and its echo came back. The agent runs one
// device's events in order, so whatever of dev the agent was going to get
// before the marker has been recorded by then. It returns the frames that
// arrived on c up to the end of the marker's echo; none may be an error.
func mtMarker(t testing.TB, n *node, c *client.Conn, dev string) []client.Frame {
	t.Helper()
	id := fmt.Sprintf("marker-%d", mtSeq.Add(1))
	text := "marker text " + id
	if err := c.Text(id, text); err != nil {
		t.Fatalf("send marker: %v", err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.Device == dev && ev.ID == id })
	fs := mtReadUntil(t, c, "the echo of "+id, func(f client.Frame) bool {
		return f.T() == protocol.TypeMessage && f.Bool("final") && strings.HasSuffix(f.Str("text"), text)
	})
	mtNoErrors(t, fs, "before the marker's echo")
	return fs
}

// mtCountEvents counts the agent's events of kind from dev with id.
func mtCountEvents(n *node, kind, dev, id string) int {
	return n.agent.count(func(ev wire.Event) bool { return ev.Kind == kind && ev.Device == dev && ev.ID == id })
}

// mtReply is one agent message as it arrived: its frames in order.
type mtReply struct {
	id     string
	frames []client.Frame
	other  []client.Frame // frames of other types read meanwhile
}

// mtReadReply reads the next agent message until its final frame. Every
// message frame read must belong to it (the demo answers one event with one
// message); no error frame may arrive.
func mtReadReply(t testing.TB, c *client.Conn) mtReply {
	t.Helper()
	var r mtReply
	fs := mtReadUntil(t, c, "an agent message", func(f client.Frame) bool {
		return f.T() == protocol.TypeMessage && f.Bool("final")
	})
	for _, f := range fs {
		switch f.T() {
		case protocol.TypeError:
			t.Fatalf("error frame while reading a reply: %s", f)
		case protocol.TypeMessage:
			if r.id == "" {
				r.id = f.Str("id")
				if r.id == "" {
					t.Fatalf("message frame without id: %s", f)
				}
			}
			if f.Str("id") != r.id {
				t.Fatalf("frames of one reply carry two ids, %q and %q: %s", r.id, f.Str("id"), mtDescribe(fs))
			}
			r.frames = append(r.frames, f)
		default:
			r.other = append(r.other, f)
		}
	}
	return r
}

// mtEdit is one version of a message: its chunks.
type mtEdit struct {
	edit   bool
	frames []client.Frame
	text   string
}

// mtEdits splits a reply into its versions (a version starts at chunk index
// 0) and checks the chunk fields of every frame: index runs 0..total-1,
// total is the same on all chunks of a version and equals
// ceil(characters/3500), no chunk is longer than 3500 characters, and every
// chunk of a version has the same edit flag.
func mtEdits(t testing.TB, r mtReply) []mtEdit {
	t.Helper()
	var edits []mtEdit
	for _, f := range r.frames {
		for _, k := range []string{"text", "chunk", "final"} {
			if !f.Has(k) {
				t.Fatalf("message frame without %s: %s", k, f)
			}
		}
		chunk := f.Map("chunk")
		if chunk.IsZero() || !chunk.Has("index") || !chunk.Has("total") {
			t.Fatalf("message frame without chunk{index,total}: %s", f)
		}
		index, total := chunk.Int("index"), chunk.Int("total")
		if index == 0 {
			edits = append(edits, mtEdit{edit: f.Bool("edit")})
		}
		if len(edits) == 0 {
			t.Fatalf("the first message frame has chunk index %d: %s", index, f)
		}
		e := &edits[len(edits)-1]
		if index != len(e.frames) {
			t.Fatalf("chunk index %d where %d was due: %s", index, len(e.frames), f)
		}
		if total < 1 || index >= total {
			t.Fatalf("chunk %d of %d: %s", index, total, f)
		}
		if len(e.frames) > 0 && e.frames[0].Map("chunk").Int("total") != total {
			t.Fatalf("chunk total changed within one version: %s", f)
		}
		if f.Bool("edit") != e.edit {
			t.Fatalf("chunk %d has edit=%v, chunk 0 of its version had %v", index, f.Bool("edit"), e.edit)
		}
		if n := utf8.RuneCountInString(f.Str("text")); n > protocol.DefaultChunkLimit {
			t.Fatalf("chunk %d carries %d characters, more than %d", index, n, protocol.DefaultChunkLimit)
		}
		e.frames = append(e.frames, f)
		e.text += f.Str("text")
	}
	for i, e := range edits {
		total := e.frames[0].Map("chunk").Int("total")
		if len(e.frames) != total {
			t.Fatalf("version %d has %d chunks, total says %d", i, len(e.frames), total)
		}
		n := utf8.RuneCountInString(e.text)
		if want := max(1, (n+protocol.DefaultChunkLimit-1)/protocol.DefaultChunkLimit); total != want {
			t.Fatalf("version %d of %d characters is cut in %d chunks, want ceil(%d/3500) = %d", i, n, total, n, want)
		}
	}
	return edits
}

// mtCheckStreamed checks the demo's streamed echo: a first message
// (final:false, not an edit), at least one edit before the final version,
// and a final version whose every chunk is an edit and whose only final
// chunk is its last. It returns the final text.
func mtCheckStreamed(t testing.TB, r mtReply) string {
	t.Helper()
	edits := mtEdits(t, r)
	if len(edits) < 3 {
		t.Fatalf("the reply has %d versions, want a first message, at least one edit and the final edit: %s", len(edits), mtDescribe(r.frames))
	}
	if edits[0].edit {
		t.Fatalf("the first message is marked edit: %s", edits[0].frames[0])
	}
	for i, e := range edits {
		last := i == len(edits)-1
		if i > 0 && !e.edit {
			t.Fatalf("version %d is not marked edit:true: %s", i, e.frames[0])
		}
		for j, f := range e.frames {
			wantFinal := last && j == len(e.frames)-1
			if f.Bool("final") != wantFinal {
				t.Fatalf("version %d chunk %d has final=%v, want %v: %s", i, j, f.Bool("final"), wantFinal, f)
			}
		}
	}
	return edits[len(edits)-1].text
}

// TestTextEchoStreamed: each text comes back as one streamed message whose
// final text holds the sent text verbatim, whatever characters it has.
func TestTextEchoStreamed(t *testing.T) {
	n := startNode(t, func(cfg *gateway.Config) { cfg.Edge.TypingIdle = 200 * time.Millisecond })
	c, _ := n.connect(t, "tel-echo")
	texts := []struct{ name, text string }{
		{"ascii", "hello gateway"},
		{"multibyte", "Привет, мир! 你好 🙂👍🏽 👨‍👩‍👧 café ñ"},
		{"quotes", `she said "hi" and 'bye'`},
		{"backslash", `C:\path\to\file \\server \" \n \u0041`},
		{"newlines", "line one\nline two\r\n\tindented\n\n"},
		{"separators", "before\u2028after\u2029para\u0000nul\u007fdel"},
		{"html", "<script>alert('x')</script> & </ws>"},
		{"single", "x"},
	}
	for i, tc := range texts {
		name, text := tc.name, tc.text
		id := fmt.Sprintf("echo-%d", i)
		if err := c.Text(id, text); err != nil {
			t.Fatal(err)
		}
		r := mtReadReply(t, c)
		got := mtCheckStreamed(t, r)
		if !strings.Contains(got, text) {
			t.Errorf("%s: final text %q does not contain %q", name, got, text)
		}
		if want := "You said: " + text; got != want {
			t.Errorf("%s: final text %q, the demo answers %q", name, got, want)
		}
		ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == id })
		if ev.Kind != wire.EventText || ev.Text != text || ev.Device != "tel-echo" || ev.Session != "mobile:tel-echo" {
			t.Errorf("%s: the agent got %+v, want text %q", name, ev, text)
		}
	}
}

// mtLongText is a text of exactly n code points mixing 1-, 2-, 3- and
// 4-byte runes.
func mtLongText(n int) string {
	runes := []rune("aé中🙂b\"\\\nж€𝄞")
	var b strings.Builder
	for i := range n {
		b.WriteRune(runes[i%len(runes)])
	}
	return b.String()
}

// TestTextLimit12000: a text of exactly 12000 code points reaches the agent
// intact; 12001 is too_big, not fatal, and never reaches the agent.
func TestTextLimit12000(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-limit")
	exact := mtLongText(protocol.MaxTextChars)
	if utf8.RuneCountInString(exact) != 12000 || len(exact) <= 12000 {
		t.Fatalf("test text has %d code points in %d bytes", utf8.RuneCountInString(exact), len(exact))
	}
	if err := c.Text("lim-ok", exact); err != nil {
		t.Fatal(err)
	}
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "lim-ok" })
	if ev.Text != exact {
		t.Fatalf("the agent got %d code points, not the 12000 sent intact", utf8.RuneCountInString(ev.Text))
	}
	mtReadReply(t, c)

	over := mtLongText(protocol.MaxTextChars + 1)
	if err := c.Text("lim-over", over); err != nil {
		t.Fatal(err)
	}
	mtExpectError(t, c, protocol.CodeTooBig)
	// 12001 ASCII characters (fewer bytes than 12000 4-byte runes) too.
	if err := c.Text("lim-over-ascii", strings.Repeat("a", protocol.MaxTextChars+1)); err != nil {
		t.Fatal(err)
	}
	mtExpectError(t, c, protocol.CodeTooBig)
	// And exactly 12000 four-byte runes (48000 bytes) passes.
	four := strings.Repeat("🙂", protocol.MaxTextChars)
	if err := c.Text("lim-four", four); err != nil {
		t.Fatal(err)
	}
	mtMarker(t, n, c, "tel-limit")
	if got := mtCountEvents(n, wire.EventText, "tel-limit", "lim-over") + mtCountEvents(n, wire.EventText, "tel-limit", "lim-over-ascii"); got != 0 {
		t.Fatalf("the agent received %d texts over the limit", got)
	}
	ev = n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "lim-four" })
	if ev.Text != four {
		t.Fatalf("12000 four-byte runes did not arrive intact (%d code points)", utf8.RuneCountInString(ev.Text))
	}
}

// TestTextReplyChunking: the echo of a 12000-character text is longer than
// 3500 characters, so every version is cut into chunks of at most 3500 code
// points with chunk{index,total}; only the last chunk of the final edit is
// final, every chunk of an edit is marked edit, and the chunks of the final
// edit join into the full reply.
func TestTextReplyChunking(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-chunk")
	text := mtLongText(protocol.MaxTextChars)
	if err := c.Text("chunk-1", text); err != nil {
		t.Fatal(err)
	}
	r := mtReadReply(t, c)
	edits := mtEdits(t, r)
	final := mtCheckStreamed(t, r)
	want := "You said: " + text
	if final != want {
		t.Fatalf("the final edit joins into %d code points, want the %d of %q+text", utf8.RuneCountInString(final), utf8.RuneCountInString(want), "You said: ")
	}
	last := edits[len(edits)-1]
	if got, wantN := len(last.frames), (utf8.RuneCountInString(want)+3499)/3500; got != wantN || got < 2 {
		t.Fatalf("the final edit came in %d chunks, want %d", got, wantN)
	}
	for j, f := range last.frames[:len(last.frames)-1] {
		if n := utf8.RuneCountInString(f.Str("text")); n != protocol.DefaultChunkLimit {
			t.Errorf("chunk %d of the final edit has %d code points; every chunk but the last should be full (3500)", j, n)
		}
	}
	// Some intermediate edit was long enough to be chunked as well.
	chunkedEdit := false
	for _, e := range edits[:len(edits)-1] {
		if len(e.frames) > 1 {
			chunkedEdit = true
			for _, f := range e.frames {
				if !f.Bool("edit") || f.Bool("final") {
					t.Errorf("a chunk of an intermediate edit: edit=%v final=%v", f.Bool("edit"), f.Bool("final"))
				}
			}
		}
	}
	if !chunkedEdit {
		t.Errorf("no intermediate edit was cut in chunks; the demo's half-way edit is %d characters", utf8.RuneCountInString(edits[1].text))
	}
	// The client library reassembles the same text.
	if err := c.Text("chunk-2", text); err != nil {
		t.Fatal(err)
	}
	first, err := c.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := c.CollectMessage(testCtx(t), first.Str("id"))
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("CollectMessage joined %d code points, want %d", utf8.RuneCountInString(got), utf8.RuneCountInString(want))
	}
}

// TestTextInvalidFrames: an empty text, a missing text, a missing or empty
// id are bad_frame, not fatal, and reach no agent.
func TestTextInvalidFrames(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-bad")
	cases := []struct {
		name  string
		frame map[string]any
	}{
		{"empty text", map[string]any{"t": "text", "id": "bad-1", "text": ""}},
		{"missing text", map[string]any{"t": "text", "id": "bad-2"}},
		{"null text", map[string]any{"t": "text", "id": "bad-3", "text": nil}},
		{"missing id", map[string]any{"t": "text", "text": "no id here"}},
		{"empty id", map[string]any{"t": "text", "id": "", "text": "empty id here"}},
		{"numeric text", map[string]any{"t": "text", "id": "bad-4", "text": 42}},
	}
	for _, tc := range cases {
		if err := c.Send(tc.frame); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		f := mtExpectError(t, c, protocol.CodeBadFrame)
		t.Logf("%s: %s", tc.name, f)
		mtAlive(t, c)
	}
	mtMarker(t, n, c, "tel-bad")
	for _, ev := range n.agent.Events() {
		if ev.Kind == wire.EventText && !strings.HasPrefix(ev.ID, "marker-") {
			t.Errorf("the agent received an invalid text: %+v", ev)
		}
	}
}

// TestTextIDTruncated: an id longer than 128 characters reaches the agent
// cut to its first 128 code points, and deduplication uses the cut id.
func TestTextIDTruncated(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-id")
	cut := strings.Repeat("ж", 127) + "Z" // 128 code points, 255 bytes
	long := cut + "-first-tail"
	if err := c.Text(long, "first text"); err != nil {
		t.Fatal(err)
	}
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.Text == "first text" })
	if ev.ID != cut {
		t.Fatalf("the agent saw id %q (%d code points), want the first 128 code points %q", ev.ID, utf8.RuneCountInString(ev.ID), cut)
	}
	mtReadReply(t, c)

	// Another id with the same first 128 characters is the same message.
	if err := c.Text(cut+"-second-tail", "second text"); err != nil {
		t.Fatal(err)
	}
	// The 128 characters alone, too.
	if err := c.Text(cut, "third text"); err != nil {
		t.Fatal(err)
	}
	// One character shorter is another message.
	shorter := strings.Repeat("ж", 127)
	if err := c.Text(shorter, "fourth text"); err != nil {
		t.Fatal(err)
	}
	fs := mtMarker(t, n, c, "tel-id")
	for _, txt := range []string{"second text", "third text"} {
		if got := n.agent.count(func(ev wire.Event) bool { return ev.Text == txt }); got != 0 {
			t.Errorf("%q with an id equal to the first after truncation was delivered %d times", txt, got)
		}
	}
	ev = n.agent.waitFor(t, func(ev wire.Event) bool { return ev.Text == "fourth text" })
	if ev.ID != shorter {
		t.Errorf("a 127-character id arrived as %q", ev.ID)
	}
	// Exactly two echoes before the marker's: none for the duplicates.
	var echoes []string
	for _, f := range fs {
		if f.T() == protocol.TypeMessage && f.Bool("final") {
			echoes = append(echoes, f.Str("text"))
		}
	}
	if len(echoes) != 2 || echoes[0] != "You said: fourth text" {
		t.Errorf("echoes before the marker's end: %q, want the fourth text's and the marker's", echoes)
	}
}

// TestDedupKeysDoNotCollide: device "phone:alice" id "7" and device "phone"
// id "alice:7" are two messages; with the key <device>:<id> the second was
// taken for a resend of the first and silently dropped.
func TestDedupKeysDoNotCollide(t *testing.T) {
	n := startNode(t, nil)
	a, _ := n.connect(t, "phone:alice")
	if err := a.Text("7", "from alice"); err != nil {
		t.Fatal(err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.Device == "phone:alice" && ev.ID == "7" })
	if got := mtCheckStreamed(t, mtReadReply(t, a)); got != "You said: from alice" {
		t.Fatalf("phone:alice's echo %q", got)
	}
	b, _ := n.connect(t, "phone")
	if err := b.Text("alice:7", "from phone"); err != nil {
		t.Fatal(err)
	}
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.Device == "phone" && ev.ID == "alice:7" })
	if ev.Text != "from phone" {
		t.Fatalf("phone's alice:7 arrived as %+v", ev)
	}
	// The agent's answer is read before the test ends, so that no agent
	// call is still delivering to a closing socket when the node closes.
	if got := mtCheckStreamed(t, mtReadReply(t, b)); got != "You said: from phone" {
		t.Fatalf("phone's echo %q", got)
	}
}

// TestTextDedup: the same id is delivered once per device, silently, also
// across a reconnect; the same id from another device is another message;
// different ids are different messages.
func TestTextDedup(t *testing.T) {
	n := startNode(t, nil)
	c, _ := n.connect(t, "tel-a")
	if err := c.Text("dup-1", "original"); err != nil {
		t.Fatal(err)
	}
	r := mtReadReply(t, c)
	if got := mtCheckStreamed(t, r); got != "You said: original" {
		t.Fatalf("echo %q", got)
	}
	// A resend with the same id and even another text: ignored, no error.
	if err := c.Text("dup-1", "original"); err != nil {
		t.Fatal(err)
	}
	if err := c.Text("dup-1", "changed text, same id"); err != nil {
		t.Fatal(err)
	}
	fs := mtMarker(t, n, c, "tel-a")
	mtCheckOnlyMarkerEcho(t, fs)
	if got := mtCountEvents(n, wire.EventText, "tel-a", "dup-1"); got != 1 {
		t.Fatalf("the agent received dup-1 %d times, want 1", got)
	}

	// After a network drop the phone reconnects at once and resends on the
	// new connection (the edge may not have noticed the drop yet).
	c.CloseNow()
	c2, _ := n.connect(t, "tel-a")
	if err := c2.Text("dup-1", "original"); err != nil {
		t.Fatal(err)
	}
	fs = mtMarker(t, n, c2, "tel-a")
	mtCheckOnlyMarkerEcho(t, fs)
	if got := mtCountEvents(n, wire.EventText, "tel-a", "dup-1"); got != 1 {
		t.Fatalf("after reconnecting the agent received dup-1 %d times, want 1", got)
	}

	// The key is <chat_id>:<id>: another device may use the same id.
	b, _ := n.connect(t, "tel-b")
	if err := b.Text("dup-1", "from b"); err != nil {
		t.Fatal(err)
	}
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.Device == "tel-b" && ev.ID == "dup-1" })
	if ev.Text != "from b" {
		t.Fatalf("tel-b's dup-1 arrived as %+v", ev)
	}
	if got := mtCheckStreamed(t, mtReadReply(t, b)); got != "You said: from b" {
		t.Fatalf("tel-b's echo %q", got)
	}

	// Different ids are both delivered, in order.
	if err := c2.Text("dup-2", "second"); err != nil {
		t.Fatal(err)
	}
	if err := c2.Text("dup-3", "third"); err != nil {
		t.Fatal(err)
	}
	mtMarker(t, n, c2, "tel-a")
	var order []string
	for _, ev := range n.agent.Events() {
		if ev.Device == "tel-a" && (ev.ID == "dup-2" || ev.ID == "dup-3") {
			order = append(order, ev.ID+"="+ev.Text)
		}
	}
	if strings.Join(order, ",") != "dup-2=second,dup-3=third" {
		t.Fatalf("the agent received %v, want dup-2 then dup-3 once each", order)
	}
	if got := mtCountEvents(n, wire.EventText, "tel-a", "dup-1"); got != 1 {
		t.Fatalf("the agent received tel-a's dup-1 %d times, want 1", got)
	}
}

// mtCheckOnlyMarkerEcho checks that the only agent message among fs is the
// marker's echo: a duplicate got no answer.
func mtCheckOnlyMarkerEcho(t testing.TB, fs []client.Frame) {
	t.Helper()
	ids := map[string]bool{}
	for _, f := range fs {
		if f.T() == protocol.TypeMessage {
			ids[f.Str("id")] = true
		}
	}
	if len(ids) != 1 {
		t.Fatalf("%d agent messages arrived where only the marker's echo was due: %s", len(ids), mtDescribe(fs))
	}
}
