package gateway_test

// Avatar and typing (spec "Connection lifecycle and avatar states"), ping,
// ack and typing from the app, and what an agent sends through its Output:
// streamed message edits and media in chunks.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// avFrame is a received frame and when it arrived.
type avFrame struct {
	client.Frame
	at time.Time
}

func (f avFrame) String() string { return f.Frame.String() }

// avRecord reads frames (each within 10 s) until stop accepts one, which is
// the last of the result.
func avRecord(t testing.TB, c *client.Conn, stop func(client.Frame) bool) []avFrame {
	t.Helper()
	var got []avFrame
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		f, err := c.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for a frame after %v: %v", got, err)
		}
		if f.Close() != nil {
			t.Fatalf("server closed the connection after %v: %s", got, f)
		}
		got = append(got, avFrame{f, time.Now()})
		if stop(f) {
			return got
		}
	}
}

func avIsAvatar(state string) func(client.Frame) bool {
	return func(f client.Frame) bool { return f.T() == protocol.TypeAvatar && f.Str("state") == state }
}

// avDescribe names frames briefly: "avatar:thinking", "typing", "typing:stop",
// "message", ...
func avDescribe(fs []avFrame) []string {
	var out []string
	for _, f := range fs {
		switch f.T() {
		case protocol.TypeAvatar:
			out = append(out, "avatar:"+f.Str("state"))
		case protocol.TypeTyping:
			if f.Bool("stop") {
				out = append(out, "typing:stop")
			} else {
				out = append(out, "typing")
			}
		default:
			out = append(out, f.T())
		}
	}
	return out
}

// avNoRepeats checks that no two consecutive avatar frames carry the same
// state (avatar frames are sent only on a change).
func avNoRepeats(t testing.TB, fs []avFrame) {
	t.Helper()
	last := ""
	for _, f := range fs {
		if f.T() != protocol.TypeAvatar {
			continue
		}
		if s := f.Str("state"); s == last {
			t.Errorf("two consecutive avatar frames with state %q: %v", s, avDescribe(fs))
		} else {
			last = s
		}
	}
}

// avIndex is the index of the first frame described as what, or -1.
func avIndex(desc []string, what string) int { return slices.Index(desc, what) }

// avLastIndex is the index of the last frame described as what, or -1.
func avLastIndex(desc []string, what string) int {
	for i := len(desc) - 1; i >= 0; i-- {
		if desc[i] == what {
			return i
		}
	}
	return -1
}

// avExpectQuiet checks nothing was sent meanwhile: a ping's pong is the very
// next frame.
func avExpectQuiet(t testing.TB, c *client.Conn) {
	t.Helper()
	ts := fmt.Sprintf("quiet-%d", time.Now().UnixNano())
	if err := c.Ping(ts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f, err := c.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.T() != protocol.TypePong || f.Str("ts") != ts {
		t.Fatalf("got %s, want the pong %q as the next frame", f, ts)
	}
}

// TestAvatarTextFrameOrder: a text to the demo gives avatar thinking and
// typing, then the message frames with avatar speaking, and after
// TypingIdle without messages avatar idle, never earlier.
func TestAvatarTextFrameOrder(t *testing.T) {
	t.Parallel()
	const idle = 200 * time.Millisecond
	n := promptsStartNode(t, func(cfg *gateway.Config) { cfg.Edge.TypingIdle = idle })
	c, _ := n.connect(t, "tel-av")
	sent := time.Now()
	if err := c.Text("av-1", "hello avatar"); err != nil {
		t.Fatal(err)
	}
	fs := avRecord(t, c, avIsAvatar(protocol.AvatarIdle))
	desc := avDescribe(fs)
	t.Logf("frames: %v", desc)

	if len(desc) == 0 || desc[0] != "avatar:thinking" {
		t.Fatalf("the first frame is not avatar thinking: %v", desc)
	}
	firstMsg, lastMsg := avIndex(desc, "message"), avLastIndex(desc, "message")
	speaking, idleAt := avIndex(desc, "avatar:speaking"), len(desc)-1
	if firstMsg < 0 {
		t.Fatalf("no message frame: %v", desc)
	}
	if typing := avIndex(desc, "typing"); typing < 0 || typing > firstMsg {
		t.Errorf("no typing frame before the first message: %v", desc)
	}
	if speaking < 0 || speaking < firstMsg || speaking > idleAt {
		t.Errorf("avatar speaking must follow the message frames and precede idle: %v", desc)
	}
	if got := strings.Count(strings.Join(desc, " "), "avatar:speaking"); got != 1 {
		t.Errorf("%d avatar speaking frames for one streamed reply, want 1 (sent on change only): %v", got, desc)
	}
	if slices.Contains(desc, "typing:stop") {
		t.Errorf("the demo does not stop typing, yet typing{stop} arrived: %v", desc)
	}
	avNoRepeats(t, fs)

	// The reply itself: one id, ending with a final frame.
	id := fs[firstMsg].Str("id")
	for i, d := range desc {
		if d == "message" && fs[i].Str("id") != id {
			t.Errorf("message frames of one reply with ids %q and %q", id, fs[i].Str("id"))
		}
	}
	if !fs[lastMsg].Bool("final") || fs[lastMsg].Str("text") != "You said: hello avatar" {
		t.Errorf("last message %s, want the final \"You said: hello avatar\"", fs[lastMsg])
	}

	// Idle comes TypingIdle after the last message, not earlier. The edge
	// starts the wait when it queues the message, after the text was sent,
	// so idle cannot arrive sooner than TypingIdle after the text; when the
	// message reached the phone depends on the machine's scheduling, so the
	// lower bound is not taken from it.
	if since := fs[idleAt].at.Sub(sent); since < idle {
		t.Errorf("avatar idle %v after the text, want no earlier than TypingIdle (%v)", since, idle)
	}
	if wait := fs[idleAt].at.Sub(fs[lastMsg].at); wait > idle+2*time.Second {
		t.Errorf("avatar idle %v after the last message, want ~%v", wait, idle)
	}
	avExpectQuiet(t, c)
}

// TestAvatarDefaultTypingIdle: with the default configuration the avatar
// stays speaking for 3 s after the last message.
func TestAvatarDefaultTypingIdle(t *testing.T) {
	t.Parallel()
	n := promptsStartNode(t, nil)
	c, _ := n.connect(t, "tel-av-default")
	sent := time.Now()
	if err := c.Text("avd-1", "slow idle"); err != nil {
		t.Fatal(err)
	}
	fs := avRecord(t, c, avIsAvatar(protocol.AvatarIdle))
	desc := avDescribe(fs)
	lastMsg := avLastIndex(desc, "message")
	if lastMsg < 0 {
		t.Fatalf("no message before idle: %v", desc)
	}
	// As in TestAvatarTextFrameOrder: not sooner than 3 s after the text,
	// and about 3 s after the last message.
	if since := fs[len(fs)-1].at.Sub(sent); since < 3*time.Second {
		t.Errorf("avatar idle %v after the text with the default config, want no earlier than 3s", since)
	}
	if wait := fs[len(fs)-1].at.Sub(fs[lastMsg].at); wait > 5*time.Second {
		t.Errorf("avatar idle %v after the last message with the default config, want ~3s", wait)
	}
}

// TestAvatarSpeakingAfterAllParts: a long message goes out in several parts
// and avatar speaking follows all of them.
func TestAvatarSpeakingAfterAllParts(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("0123456789", 800) // 8000 chars: 3 parts of <= 3500
	n := promptsStartNode(t, func(cfg *gateway.Config) {
		cfg.Edge.TypingIdle = 200 * time.Millisecond
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Kind != wire.EventText {
				return nil
			}
			return out.Message(ctx, "long-1", long, false, true)
		})
	})
	c, _ := n.connect(t, "tel-av-long")
	if err := c.Text("avl-1", "go"); err != nil {
		t.Fatal(err)
	}
	fs := avRecord(t, c, avIsAvatar(protocol.AvatarIdle))
	desc := avDescribe(fs)
	want := []string{"avatar:thinking", "message", "message", "message", "avatar:speaking", "avatar:idle"}
	if !slices.Equal(desc, want) {
		t.Fatalf("frames %v, want %v", desc, want)
	}
	var text strings.Builder
	for i, f := range fs[1:4] {
		if f.Str("id") != "long-1" || f.Map("chunk").Int("index") != i || f.Map("chunk").Int("total") != 3 || f.Bool("final") != (i == 2) {
			t.Errorf("part %d: %s", i, f)
		}
		text.WriteString(f.Str("text"))
	}
	if text.String() != long {
		t.Errorf("the parts do not add up to the message (%d chars of %d)", text.Len(), len(long))
	}
}

// TestAvatarTypingStop: an agent that stops typing after its message clears
// the indicator and idles the avatar at once, well before TypingIdle.
func TestAvatarTypingStop(t *testing.T) {
	t.Parallel()
	const idle = 3 * time.Second
	n := promptsStartNode(t, func(cfg *gateway.Config) {
		cfg.Edge.TypingIdle = idle
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Kind != wire.EventText {
				return nil
			}
			if err := out.Typing(ctx, false); err != nil {
				return err
			}
			if err := out.Message(ctx, "r-stop", "done", false, true); err != nil {
				return err
			}
			return out.Typing(ctx, true)
		})
	})
	c, _ := n.connect(t, "tel-av-stop")
	if err := c.Text("avs-1", "work"); err != nil {
		t.Fatal(err)
	}
	fs := avRecord(t, c, avIsAvatar(protocol.AvatarIdle))
	desc := avDescribe(fs)
	want := []string{"avatar:thinking", "typing", "message", "avatar:speaking", "typing:stop", "avatar:idle"}
	if !slices.Equal(desc, want) {
		t.Fatalf("frames %v, want %v", desc, want)
	}
	if fs[1].Has("stop") && fs[1].Bool("stop") {
		t.Errorf("Typing(false) arrived as %s", fs[1])
	}
	if wait := fs[5].at.Sub(fs[2].at); wait > time.Second {
		t.Errorf("avatar idle %v after the message despite typing{stop}, want at once (TypingIdle is %v)", wait, idle)
	}
	avExpectQuiet(t, c)
}

// TestAvatarStates: an agent's avatar states are passed on, an unknown one
// as idle, and an avatar frame is sent only when the state changes.
func TestAvatarStates(t *testing.T) {
	t.Parallel()
	n := promptsStartNode(t, func(cfg *gateway.Config) {
		cfg.Edge.TypingIdle = 200 * time.Millisecond
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Kind != wire.EventText {
				return nil
			}
			// The edge has just shown thinking for the text.
			for _, s := range []string{"bogus", "speaking", "speaking", "thinking", "thinking", "", "idle"} {
				if err := out.Avatar(ctx, s); err != nil {
					return err
				}
			}
			return out.Message(ctx, "r-end", "end", false, true)
		})
	})
	c, _ := n.connect(t, "tel-av-states")
	if err := c.Text("ava-1", "states"); err != nil {
		t.Fatal(err)
	}
	fs := avRecord(t, c, func(f client.Frame) bool { return f.T() == protocol.TypeMessage })
	fs = append(fs, avRecord(t, c, avIsAvatar(protocol.AvatarIdle))...)
	desc := avDescribe(fs)
	want := []string{
		"avatar:thinking", // the edge, for the text
		"avatar:idle",     // bogus
		"avatar:speaking", // speaking (the second one: no frame)
		"avatar:thinking", // thinking (the second one: no frame)
		"avatar:idle",     // "" (then idle: no change)
		"message",
		"avatar:speaking", // the message
		"avatar:idle",     // TypingIdle later
	}
	if !slices.Equal(desc, want) {
		t.Errorf("frames %v, want %v", desc, want)
	}
	avNoRepeats(t, fs)
	for _, f := range fs {
		if f.T() == protocol.TypeAvatar && !slices.Contains([]string{"idle", "thinking", "speaking"}, f.Str("state")) {
			t.Errorf("avatar state outside the spec: %s", f)
		}
	}
	avExpectQuiet(t, c)
}

// TestPingPong: pong echoes ts whatever its JSON type; a ping without ts is
// answered too; t is case-insensitive.
func TestPingPong(t *testing.T) {
	t.Parallel()
	n := promptsStartNode(t, nil)
	c, _ := n.connect(t, "tel-ping")
	for _, ts := range []string{
		`123`,
		`0`,
		`-7`,
		`9007199254740993`, // 2^53+1: not a float64
		`123456789012345678901234567890`,
		`1.5`,
		`1e300`,
		`"abc"`,
		`""`,
		`"héllo ✓ \"q\" \\ \u0000"`,
		`{"a":1,"b":[true,false,null],"c":{"d":"e"}}`,
		`{}`,
		`[1,"two",3.25,[],{}]`,
		`[]`,
		`true`,
	} {
		if err := c.SendRaw([]byte(`{"t":"ping","ts":` + ts + `}`)); err != nil {
			t.Fatal(err)
		}
		f := avNextFrame(t, c)
		if f.T() != protocol.TypePong {
			t.Errorf("ping ts=%s: got %s, want pong", ts, f)
			continue
		}
		want := avDecodeJSON(t, ts)
		if got, ok := f.Fields()["ts"]; !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("ping ts=%s: pong %s, want ts echoed exactly", ts, f)
		}
	}

	if err := c.Ping(nil); err != nil {
		t.Fatal(err)
	}
	if f := avNextFrame(t, c); f.T() != protocol.TypePong || f.Has("ts") && f.Get("ts") != nil {
		t.Errorf("ping without ts: got %s, want a pong without ts", f)
	}

	if err := c.SendRaw([]byte(`{"t":"PING","ts":42}`)); err != nil {
		t.Fatal(err)
	}
	if f := avNextFrame(t, c); f.T() != protocol.TypePong || f.Int("ts") != 42 {
		t.Errorf(`{"t":"PING"}: got %s, want pong 42`, f)
	}
}

// avNextFrame is the very next frame (nothing skipped).
func avNextFrame(t testing.TB, c *client.Conn) client.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f, err := c.Next(ctx)
	if err != nil {
		t.Fatalf("waiting for a frame: %v", err)
	}
	return f
}

func avDecodeJSON(t testing.TB, s string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("bad JSON literal %s: %v", s, err)
	}
	return v
}

// TestAckAndTypingAreSilent: ack and typing from the app are taken without
// an answer: a ping sent after them gets its pong as the next frame.
func TestAckAndTypingAreSilent(t *testing.T) {
	t.Parallel()
	n := promptsStartNode(t, nil)
	c, _ := n.connect(t, "tel-ack")
	steps := []struct {
		name string
		send func() error
	}{
		{"ack", func() error { return c.Ack("m-1") }},
		{"ack of an unknown id", func() error { return c.Ack("never-sent") }},
		{"typing", c.Typing},
		{"typing twice", c.Typing},
		{"TYPING", func() error { return c.SendRaw([]byte(`{"t":"TYPING"}`)) }},
	}
	for _, s := range steps {
		if err := s.send(); err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(s.name); err != nil {
			t.Fatal(err)
		}
		if f := avNextFrame(t, c); f.T() != protocol.TypePong || f.Str("ts") != s.name {
			t.Errorf("%s: the next frame is %s, want the pong %q", s.name, f, s.name)
		}
	}
	if got := n.agent.Events(); len(got) != 0 {
		t.Errorf("the agent got %+v from ack/typing, want nothing", got)
	}
}

// TestAgentStreamingEdits: an agent's message, edit and final edit reach the
// app as three frames of one id with edit false/true/true and final
// false/false/true.
func TestAgentStreamingEdits(t *testing.T) {
	t.Parallel()
	n := promptsStartNode(t, func(cfg *gateway.Config) {
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Kind != wire.EventText {
				return nil
			}
			for _, s := range []struct {
				text        string
				edit, final bool
			}{{"a", false, false}, {"ab", true, false}, {"abc", true, true}} {
				if err := out.Message(ctx, "stream-1", s.text, s.edit, s.final); err != nil {
					return err
				}
			}
			return nil
		})
	})
	c, _ := n.connect(t, "tel-stream")
	if err := c.Text("st-1", "stream please"); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		text        string
		edit, final bool
	}{{"a", false, false}, {"ab", true, false}, {"abc", true, true}}
	for i, w := range want {
		f := promptNext(t, c)
		if f.T() != protocol.TypeMessage || f.Str("id") != "stream-1" || f.Str("text") != w.text ||
			f.Bool("edit") != w.edit || f.Bool("final") != w.final {
			t.Errorf("frame %d: %s, want message stream-1 %q edit %v final %v", i, f, w.text, w.edit, w.final)
		}
		if _, ok := f.Get("final").(bool); !ok {
			t.Errorf("frame %d has no boolean final: %s", i, f)
		}
		if ch := f.Map("chunk"); ch.IsZero() || ch.Int("index") != 0 || ch.Int("total") != 1 {
			t.Errorf("frame %d chunk: %s, want {index:0,total:1}", i, f)
		}
	}
	avExpectQuiet(t, c)
}

// TestAgentMediaChunks: a file the agent sends goes out in 3 MiB chunks with
// kind, mime, filename and caption as given and the whole size on every
// chunk; 8 MiB is the most an agent can send.
func TestAgentMediaChunks(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	payload := func(size int) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i*7 + i>>12)
		}
		return b
	}
	n := promptsStartNode(t, func(cfg *gateway.Config) {
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Kind != wire.EventText {
				return nil
			}
			size, err := strconv.Atoi(ev.Text)
			if err != nil {
				return err
			}
			err = out.Media(ctx, agent.Media{
				ID: "file-" + ev.Text, Kind: "document", Mime: "application/pdf",
				Filename: "report.pdf", Caption: "the report", Data: payload(size),
			})
			text := "sent"
			if err != nil {
				text = "refused: " + err.Error()
			}
			return out.Message(ctx, "r-"+ev.Text, text, false, true)
		})
	})
	for _, tc := range []struct {
		name   string
		size   int
		chunks []int // nil: the agent's Media is refused
	}{
		{"7 MiB", 7 * mib, []int{3 * mib, 3 * mib, 1 * mib}},
		{"3 MiB", 3 * mib, []int{3 * mib}},
		{"3 MiB + 1", 3*mib + 1, []int{3 * mib, 1}},
		{"8 MiB", 8 * mib, []int{3 * mib, 3 * mib, 2 * mib}},
		{"8 MiB + 1", 8*mib + 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := n.connect(t, fmt.Sprintf("tel-media-%d", tc.size))
			if err := c.Text("md-1", strconv.Itoa(tc.size)); err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("file-%d", tc.size)
			var got []byte
			for i, want := range tc.chunks {
				f := promptNext(t, c)
				if f.T() != protocol.TypeMedia {
					t.Fatalf("chunk %d: got %s, want media", i, f.String()[:min(len(f.String()), 300)])
				}
				if f.Str("id") != id || f.Str("kind") != "document" || f.Str("mime") != "application/pdf" ||
					f.Str("filename") != "report.pdf" {
					t.Errorf("chunk %d: id/kind/mime/filename %q %q %q %q", i, f.Str("id"), f.Str("kind"), f.Str("mime"), f.Str("filename"))
				}
				if f.Int("part") != i || f.Int("parts") != len(tc.chunks) || f.Bool("final") != (i == len(tc.chunks)-1) {
					t.Errorf("chunk %d: part %v parts %v final %v, want %d of %d", i, f.Get("part"), f.Get("parts"), f.Get("final"), i, len(tc.chunks))
				}
				if f.Int("size") != tc.size {
					t.Errorf("chunk %d: size %v, want the whole file, %d", i, f.Get("size"), tc.size)
				}
				if i == 0 && f.Str("caption") != "the report" {
					t.Errorf("chunk 0: caption %q", f.Str("caption"))
				}
				data, err := base64.StdEncoding.DecodeString(f.Str("data"))
				if err != nil {
					t.Fatalf("chunk %d: data is not base64: %v", i, err)
				}
				if len(data) != want {
					t.Errorf("chunk %d: %d bytes, want %d", i, len(data), want)
				}
				got = append(got, data...)
			}
			if tc.chunks != nil && !bytes.Equal(got, payload(tc.size)) {
				t.Errorf("the chunks do not reassemble into the file (%d bytes)", len(got))
			}
			f := promptNext(t, c)
			wantText := "sent"
			if tc.chunks == nil {
				wantText = "refused: "
			}
			if f.T() != protocol.TypeMessage || !strings.HasPrefix(f.Str("text"), wantText) {
				t.Errorf("after the file: got %s, want the message %q", f, wantText)
			}
		})
	}
}
