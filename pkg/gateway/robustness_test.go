package gateway_test

// Black-box robustness tests: the 16 MiB frame limit (whole and fragmented),
// malformed and unknown frames after hello, a seeded burst of garbage,
// WebSocket control frames, and the goroutine cost of idle connections.
// Helpers are prefixed rb; the hs helpers come from handshake_test.go.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// rbPaddedPing is a ping frame with ts, padded with an unknown member to
// exactly size bytes of valid JSON.
func rbPaddedPing(ts string, size int) []byte {
	prefix := `{"t":"ping","ts":"` + ts + `","pad":"`
	const suffix = `"}`
	b := make([]byte, size)
	copy(b, prefix)
	for i := len(prefix); i < size-len(suffix); i++ {
		b[i] = 'a'
	}
	copy(b[size-len(suffix):], suffix)
	return b
}

// rbSend runs send in the background (the client keeps reading meanwhile)
// and returns a channel with its result.
func rbSend(send func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- send() }()
	return ch
}

// rbExpectPong waits (up to d) for the pong echoing ts, failing on an error
// frame or the end of the connection.
func rbExpectPong(t *testing.T, c *client.Conn, ts string, d time.Duration) {
	t.Helper()
	ctx := hsWait(t, d)
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for pong %q: %v (frame %v)", ts, err, f)
		}
		switch {
		case f.Close() != nil:
			t.Fatalf("connection closed (%s) instead of pong %q", f.Close(), ts)
		case f.T() == protocol.TypeError:
			t.Fatalf("error frame instead of pong %q: %s", ts, f)
		case f.T() == protocol.TypePong && f.Str("ts") == ts:
			return
		}
	}
}

// TestFrameSizeLimit: a message of exactly MAX_FRAME_BYTES is handled, one
// byte more is a fatal too_big with close 1008 "too_big".
func TestFrameSizeLimit(t *testing.T) {
	if protocol.MaxFrameBytes != 16777216 {
		t.Fatalf("protocol.MaxFrameBytes = %d, the spec says 16777216", protocol.MaxFrameBytes)
	}
	n := hsNode(t, nil)

	t.Run("exactly 16 MiB is accepted", func(t *testing.T) {
		c, _ := n.connect(t, "tel-big")
		frame := rbPaddedPing("big", protocol.MaxFrameBytes)
		if !json.Valid(frame) || len(frame) != 16777216 {
			t.Fatal("the padded frame is not 16 MiB of valid JSON")
		}
		sent := rbSend(func() error { return c.SendRaw(frame) })
		rbExpectPong(t, c, "big", 60*time.Second)
		if err := <-sent; err != nil {
			t.Fatalf("sending 16 MiB: %v", err)
		}
		if before := hsPing(t, c, "after-big"); len(before) != 0 {
			t.Fatalf("frames after the 16 MiB ping: %v", before)
		}
		hsEcho(t, c, "big-1", "still working")
	})
	t.Run("16 MiB + 1 is too_big", func(t *testing.T) {
		c, _ := n.connect(t, "tel-too-big")
		frame := rbPaddedPing("too-big", protocol.MaxFrameBytes+1)
		sent := rbSend(func() error { return c.SendRaw(frame) })
		hsExpectFatal(t, c, protocol.CodeTooBig, "16 MiB + 1 byte")
		select {
		case err := <-sent:
			t.Logf("sending 16 MiB + 1 ended with %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("the 16 MiB + 1 send never ended")
		}
	})
	t.Run("the header alone decides", func(t *testing.T) {
		// A header announcing 16 MiB + 1 is refused before its payload.
		c, _ := n.connect(t, "tel-header")
		if err := c.SendHeaderOnly(protocol.MaxFrameBytes + 1); err != nil {
			t.Fatal(err)
		}
		// The server may refuse (and close) before these bytes go out: the
		// send can fail, and that is the point.
		_ = c.SendPayload([]byte(`{"t":"ping"`))
		hsExpectFatal(t, c, protocol.CodeTooBig, "header announcing 16 MiB + 1")
	})
	t.Run("before hello", func(t *testing.T) {
		c := n.dial(t)
		if err := c.SendHeaderOnly(protocol.MaxFrameBytes + 1); err != nil {
			t.Fatal(err)
		}
		hsExpectFatal(t, c, protocol.CodeTooBig, "16 MiB + 1 as the first frame")
	})
	// The node is unharmed.
	c, _ := n.connect(t, "tel-after")
	hsEcho(t, c, "after-1", "after the big frames")
	hsWaitConns(t, n, 1) // tel-after; the subtests' sockets are gone
}

// TestFrameSizeFragmented: the limit applies to the reassembled message;
// small fragmented messages are reassembled and handled.
func TestFrameSizeFragmented(t *testing.T) {
	n := hsNode(t, nil)

	t.Run("small text in 7 fragments", func(t *testing.T) {
		c, _ := n.connect(t, "tel-frag")
		text := "héllo wörld ✓ fragmented — ещё"
		raw, _ := json.Marshal(map[string]string{"t": "text", "id": "frag-1", "text": text})
		if err := c.SendFragmented(raw, 7); err != nil {
			t.Fatal(err)
		}
		msg, err := c.Expect(hsWait(t, 10*time.Second), protocol.TypeMessage)
		if err != nil {
			t.Fatal(err)
		}
		reply, _, err := c.CollectMessage(hsWait(t, 10*time.Second), msg.Str("id"))
		if err != nil || !strings.Contains(reply, text) {
			t.Fatalf("reply %q, %v; want the echo of %q", reply, err, text)
		}
		ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "frag-1" })
		if ev.Text != text {
			t.Fatalf("the agent got %q, want %q", ev.Text, text)
		}
	})
	t.Run("ping in more fragments than bytes", func(t *testing.T) {
		c, _ := n.connect(t, "tel-frag-empty")
		raw := []byte(`{"t":"ping","ts":"frag"}`)
		if err := c.SendFragmented(raw, len(raw)+5); err != nil { // some fragments are empty
			t.Fatal(err)
		}
		rbExpectPong(t, c, "frag", 10*time.Second)
	})
	t.Run("exactly 16 MiB in 4 fragments", func(t *testing.T) {
		c, _ := n.connect(t, "tel-frag-big")
		frame := rbPaddedPing("frag-big", protocol.MaxFrameBytes)
		sent := rbSend(func() error { return c.SendFragmented(frame, 4) })
		rbExpectPong(t, c, "frag-big", 60*time.Second)
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		hsPing(t, c, "after-frag-big")
	})
	t.Run("16 MiB + 1 in 4 fragments", func(t *testing.T) {
		c, _ := n.connect(t, "tel-frag-too-big")
		frame := rbPaddedPing("frag-too-big", protocol.MaxFrameBytes+1)
		sent := rbSend(func() error { return c.SendFragmented(frame, 4) })
		hsExpectFatal(t, c, protocol.CodeTooBig, "fragments adding up to 16 MiB + 1")
		select {
		case err := <-sent:
			t.Logf("the fragmented send ended with %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("the fragmented send never ended")
		}
	})
	t.Run("16 MiB + 1 in 2 fragments of about 8 MiB", func(t *testing.T) {
		c, _ := n.connect(t, "tel-frag-too-big-2")
		frame := rbPaddedPing("frag-too-big-2", protocol.MaxFrameBytes+1)
		sent := rbSend(func() error { return c.SendFragmented(frame, 2) })
		hsExpectFatal(t, c, protocol.CodeTooBig, "two fragments adding up to 16 MiB + 1")
		<-sent
	})
}

// TestRobustnessBadFrames: after hello, each malformed frame gets exactly
// one error of the specified code, not fatal, and the connection goes on.
func TestRobustnessBadFrames(t *testing.T) {
	n := hsNode(t, nil)
	c, _ := n.connect(t, "tel-bad")
	cases := []struct {
		name string
		raw  string
		code protocol.Code
	}{
		// Not UTF-8.
		{"invalid utf-8 in a text", "{\"t\":\"text\",\"id\":\"u1\",\"text\":\"\xff\xfe\"}", protocol.CodeBadFrame},
		{"invalid utf-8 in an unknown frame", "{\"t\":\"future\",\"x\":\"\xc3\"}", protocol.CodeBadFrame},
		{"overlong utf-8", "{\"t\":\"ping\",\"ts\":\"\xc0\xaf\"}", protocol.CodeBadFrame},
		{"utf-16 surrogate", "{\"t\":\"ping\",\"ts\":\"\xed\xa0\x80\"}", protocol.CodeBadFrame},
		{"latin-1 bytes", "{\"t\":\"text\",\"id\":\"u2\",\"text\":\"caf\xe9\"}", protocol.CodeBadFrame},
		// Not JSON.
		{"plain text", "hello there", protocol.CodeBadFrame},
		{"empty message", "", protocol.CodeBadFrame},
		{"truncated object", `{"t":"ping"`, protocol.CodeBadFrame},
		{"extra brace", `{"t":"ping"}}`, protocol.CodeBadFrame},
		{"two objects", `{"t":"ping"} {"t":"ping"}`, protocol.CodeBadFrame},
		{"single quotes", `{'t':'ping'}`, protocol.CodeBadFrame},
		{"trailing comma", `{"t":"ping",}`, protocol.CodeBadFrame},
		{"NaN", `{"t":"ping","ts":NaN}`, protocol.CodeBadFrame},
		// Not an object.
		{"array", `[{"t":"ping"}]`, protocol.CodeBadFrame},
		{"empty array", `[]`, protocol.CodeBadFrame},
		{"string", `"ping"`, protocol.CodeBadFrame},
		{"number", `42`, protocol.CodeBadFrame},
		{"null", `null`, protocol.CodeBadFrame},
		{"bool", `true`, protocol.CodeBadFrame},
		// No t.
		{"empty object", `{}`, protocol.CodeBadFrame},
		{"object without t", `{"id":"1","text":"x"}`, protocol.CodeBadFrame},
		{"T instead of t", `{"T":"ping"}`, protocol.CodeBadFrame},
		{"empty t", `{"t":""}`, protocol.CodeBadFrame},
		// t not a string.
		{"t number", `{"t":5}`, protocol.CodeBadFrame},
		{"t null", `{"t":null}`, protocol.CodeBadFrame},
		{"t array", `{"t":["ping"]}`, protocol.CodeBadFrame},
		{"t object", `{"t":{"type":"ping"}}`, protocol.CodeBadFrame},
		{"t bool", `{"t":true}`, protocol.CodeBadFrame},
		// Known frames with a missing field or a field of the wrong type.
		{"text id number", `{"t":"text","id":5,"text":"x"}`, protocol.CodeBadFrame},
		{"text text object", `{"t":"text","id":"w1","text":{"a":1}}`, protocol.CodeBadFrame},
		{"text without text", `{"t":"text","id":"w2"}`, protocol.CodeBadFrame},
		{"media parts string", `{"t":"media","id":"w3","kind":"image","data":"AAAA","parts":"2"}`, protocol.CodeBadFrame},
		{"audio data not base64", `{"t":"audio","id":"w4","format":"wav","data":"!!!"}`, protocol.CodeBadFrame},
		{"prompt without answer", `{"t":"prompt","prompt_id":"p1"}`, protocol.CodeBadFrame},
	}
	for i, tc := range cases {
		if err := c.SendRaw([]byte(tc.raw)); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		f := hsNext(t, c, tc.name)
		hsCheckError(t, f, tc.code, false, tc.name)
		if before := hsPing(t, c, "bad-"+strconv.Itoa(i)); len(before) != 0 {
			t.Fatalf("%s: more frames after the error: %v", tc.name, before)
		}
	}
	if got := n.agent.count(func(wire.Event) bool { return true }); got != 0 {
		t.Fatalf("bad frames reached the agent: %+v", n.agent.Events())
	}
	hsEcho(t, c, "bad-end", "alive after bad frames")
}

// TestRobustnessIgnoredFrames: unknown types are ignored without any error
// frame, as are ack and typing; the next frame on the wire is the pong.
func TestRobustnessIgnoredFrames(t *testing.T) {
	n := hsNode(t, nil)
	c, _ := n.connect(t, "tel-ignore")
	for i, raw := range []string{
		`{"t":"future","x":1}`,
		`{"t":"FUTURE_THING","id":5}`,
		`{"t":"future","text":0,"data":[1],"parts":"x"}`, // members that would not fit ours
		`{"t":"future","nested":{"deep":[1,2,{"x":null}]}}`,
		`{"t":"ready","v":2}`, // server frame types are unknown from a client
		`{"t":"pong","ts":1}`,
		`{"t":"error","code":"bad_frame","fatal":true}`,
		`{"t":"message","id":"m","text":"x"}`,
		`{"t":"ack","id":"m-1"}`,
		`{"t":"ack"}`,
		`{"t":"ACK","id":"m-2","extra":true}`,
		`{"t":"typing"}`,
		`{"t":"Typing","stop":true}`,
	} {
		if err := c.SendRaw([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		if before := hsPing(t, c, "ign-"+strconv.Itoa(i)); len(before) != 0 {
			t.Fatalf("%s was not silently ignored: %v", raw, before)
		}
	}
	// The typed helpers too.
	if err := c.Ack("x-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Typing(); err != nil {
		t.Fatal(err)
	}
	if before := hsPing(t, c, "helpers"); len(before) != 0 {
		t.Fatalf("ack/typing produced %v", before)
	}
	if got := n.agent.count(func(wire.Event) bool { return true }); got != 0 {
		t.Fatalf("ignored frames reached the agent: %+v", n.agent.Events())
	}
}

// TestRobustnessCaseInsensitiveType: t is lowercased before dispatch.
func TestRobustnessCaseInsensitiveType(t *testing.T) {
	n := hsNode(t, nil)
	c, _ := n.connect(t, "tel-case")
	if err := c.SendRaw([]byte(`{"t":"Ping","ts":"ci-1"}`)); err != nil {
		t.Fatal(err)
	}
	pong := hsNext(t, c, "Ping")
	if pong.T() != "pong" || pong.Str("ts") != "ci-1" {
		t.Fatalf("Ping answered with %s, want {\"t\":\"pong\",\"ts\":\"ci-1\"}", pong)
	}
	if err := c.SendRaw([]byte(`{"t":"pInG"}`)); err != nil {
		t.Fatal(err)
	}
	pong = hsNext(t, c, "pInG")
	if pong.T() != "pong" || pong.Has("ts") {
		t.Fatalf("pInG without ts answered with %s, want a pong without ts", pong)
	}
	if err := c.SendRaw([]byte(`{"t":"TEXT","id":"ci-2","text":"upper case type"}`)); err != nil {
		t.Fatal(err)
	}
	msg, err := c.Expect(hsWait(t, 10*time.Second), protocol.TypeMessage)
	if err != nil {
		t.Fatal(err)
	}
	reply, _, err := c.CollectMessage(hsWait(t, 10*time.Second), msg.Str("id"))
	if err != nil || !strings.Contains(reply, "upper case type") {
		t.Fatalf("TEXT reply %q, %v", reply, err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "ci-2" && ev.Kind == wire.EventText })
}

// TestRobustnessBinaryMessage documents what the gateway does with a binary
// WebSocket message: the spec speaks only of JSON text frames; the gateway
// handles a binary message exactly like a text one.
func TestRobustnessBinaryMessage(t *testing.T) {
	n := hsNode(t, nil)
	c, _ := n.connect(t, "tel-bin")
	if err := c.SendBinary([]byte(`{"t":"ping","ts":"bin"}`)); err != nil {
		t.Fatal(err)
	}
	pong := hsNext(t, c, "binary ping")
	if pong.T() != "pong" || pong.Str("ts") != "bin" {
		t.Fatalf("binary ping answered with %s", pong)
	}
	// Its content is validated like a text message's: invalid UTF-8 is
	// bad_frame, and the connection goes on.
	if err := c.SendBinary([]byte{0xff, 0x00, 0x01}); err != nil {
		t.Fatal(err)
	}
	hsCheckError(t, hsNext(t, c, "binary garbage"), protocol.CodeBadFrame, false, "binary garbage")
	hsPing(t, c, "after-binary")
}

// rbTemplates are valid client frames the garbage is made from.
var rbTemplates = []string{
	`{"t":"text","id":"g","text":"hi"}`,
	`{"t":"audio","id":"g","format":"wav","data":"UklGRg==","text":"x"}`,
	`{"t":"media","id":"g","kind":"image","mime":"image/png","filename":"a.png","caption":"c","data":"iVBORw0=","part":0,"parts":1}`,
	`{"t":"prompt","prompt_id":"p","option_id":"once","text":"x"}`,
	`{"t":"ping","ts":1}`,
	`{"t":"typing"}`,
	`{"t":"ack","id":"g"}`,
	`{"t":"deliver","id":"g","target":"tel-nobody","text":"hi","media":{"kind":"image","data":"AAAA"}}`,
	`{"t":"hello","token":"x","device":{"id":"d","name":"n"},"user":{"id":"u","name":"n"}}`,
}

// rbWrongValues replace a member with one of another JSON kind.
var rbWrongValues = []any{
	int64(123), int64(-1), 1.5, 1e300, true, false, nil,
	[]any{1, "a"}, map[string]any{"x": 1}, "", "str", strings.Repeat("z", 50),
}

func rbKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64, int64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "null"
	case []any:
		return "array"
	}
	return "object"
}

// rbGarbage makes one garbage message: random bytes, a truncated valid
// frame, a known frame with a member of the wrong type, deep nesting, an
// oversized text, or an unknown type.
func rbGarbage(r *rand.Rand) (payload []byte, binary bool) {
	switch k := r.IntN(20); {
	case k < 4: // random bytes
		b := make([]byte, r.IntN(300))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		return b, r.IntN(4) == 0
	case k < 8: // a truncated valid frame
		tpl := rbTemplates[r.IntN(len(rbTemplates))]
		return []byte(tpl[:r.IntN(len(tpl))]), false
	case k < 14: // a member of the wrong type
		var m map[string]any
		_ = json.Unmarshal([]byte(rbTemplates[r.IntN(len(rbTemplates))]), &m)
		keys := make([]string, 0, len(m))
		for key := range m {
			keys = append(keys, key)
		}
		slices.Sort(keys)
		key := keys[r.IntN(len(keys))]
		for {
			v := rbWrongValues[r.IntN(len(rbWrongValues))]
			if rbKind(v) != rbKind(m[key]) {
				m[key] = v
				break
			}
		}
		if r.IntN(3) == 0 {
			// With a random case of t, when t is still a string.
			if s, ok := m["t"].(string); ok && s != "" {
				b := []byte(s)
				for i := range b {
					if r.IntN(2) == 0 {
						b[i] = byte(strings.ToUpper(string(b[i]))[0])
					}
				}
				m["t"] = string(b)
			}
		}
		b, _ := json.Marshal(m)
		return b, false
	case k < 16: // deep nesting, closed or not
		d := r.IntN(20000)
		s := `{"t":"ping","ts":` + strings.Repeat("[", d)
		if r.IntN(2) == 0 {
			s += strings.Repeat("]", d) + `}`
		}
		return []byte(s), false
	case k < 17: // limits
		switch r.IntN(3) {
		case 0:
			return []byte(`{"t":"text","id":"g-big","text":"` + strings.Repeat("ж", protocol.MaxTextChars+1) + `"}`), false
		case 1:
			return []byte(`{"t":"media","id":"g-parts","kind":"image","data":"AAAA","part":0,"parts":2049}`), false
		default:
			return []byte(`{"t":"media","id":"g-part","kind":"image","data":"AAAA","part":5,"parts":5}`), false
		}
	default: // an unknown type with random members
		m := map[string]any{"t": fmt.Sprintf("x-%d", r.IntN(1000))}
		for range r.IntN(5) {
			m[fmt.Sprintf("k%d", r.IntN(10))] = rbWrongValues[r.IntN(len(rbWrongValues))]
		}
		b, _ := json.Marshal(m)
		return b, r.IntN(5) == 0
	}
}

// rbDefinitelyBad reports whether the spec makes p a bad_frame whatever it
// says: not UTF-8, not JSON, or not an object.
func rbDefinitelyBad(p []byte) bool {
	if !utf8.Valid(p) || !json.Valid(p) {
		return true
	}
	var obj map[string]any
	return json.Unmarshal(p, &obj) != nil || obj == nil
}

// TestRobustnessGarbageBurst: 2,000 seeded garbage messages, each followed by
// a ping, sent without waiting. Every definitely-bad message gets exactly one
// bad_frame; no error is fatal or internal; the connection survives; and a
// new connection works afterwards.
func TestRobustnessGarbageBurst(t *testing.T) {
	const count = 2000
	const seed = 20260101
	n := hsNode(t, nil)
	c := n.dial(t, client.Options{Buffer: 16384})
	hsHello(t, c, testToken, protocol.Device{ID: "tel-garbage"})

	r := rand.New(rand.NewPCG(seed, seed))
	payloads := make([][]byte, count)
	binary := make([]bool, count)
	for i := range payloads {
		payloads[i], binary[i] = rbGarbage(r)
	}

	// Read everything in the background until the last pong.
	type result struct {
		frames []client.Frame
		err    error
	}
	done := make(chan result, 1)
	go func() {
		var res result
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for {
			f, err := c.Next(ctx)
			if !f.IsZero() {
				res.frames = append(res.frames, f)
			}
			if err != nil {
				res.err = err
				break
			}
			if f.Close() != nil || (f.T() == protocol.TypePong && f.Str("ts") == "end") {
				break
			}
		}
		done <- res
	}()

	for i, p := range payloads {
		var err error
		if binary[i] {
			err = c.SendBinary(p)
		} else {
			err = c.SendRaw(p)
		}
		if err == nil {
			err = c.Ping(strconv.Itoa(i))
		}
		if err != nil {
			t.Fatalf("sending garbage %d (%q): %v", i, rbShort(p), err)
		}
	}
	if err := c.Ping("end"); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("the abused connection ended: %v; last frames %v", res.err, rbLast(res.frames, 5))
	}
	last := res.frames[len(res.frames)-1]
	if ci := last.Close(); ci != nil {
		t.Fatalf("the abused connection was closed (%s); last frames %v", ci, rbLast(res.frames, 5))
	}

	// Attribute the error frames to the garbage that preceded each pong.
	errorsAfter := make([][]client.Frame, count)
	i := 0
	codes := map[string]int{}
	for _, f := range res.frames {
		switch f.T() {
		case protocol.TypePong:
			if f.Str("ts") == strconv.Itoa(i) {
				i++
			}
		case protocol.TypeError:
			code := f.Str("code")
			codes[code]++
			if f.Bool("fatal") {
				t.Errorf("fatal error after garbage %d (%q): %s", i, rbShort(payloads[min(i, count-1)]), f)
			}
			if code == string(protocol.CodeInternalError) || !slices.Contains(hsDocumentedCodes, code) {
				t.Errorf("error %s after garbage %d (%q)", f, i, rbShort(payloads[min(i, count-1)]))
			}
			// A deliver is answered once the router answers, after the
			// pongs of frames read later: its error names the deliver and
			// is not attributed by position.
			async := code == string(protocol.CodeDeviceOffline) && strings.HasPrefix(f.Str("message"), "deliver ")
			if i < count && !async {
				errorsAfter[i] = append(errorsAfter[i], f)
			}
		}
	}
	if i != count {
		t.Fatalf("%d of %d pongs arrived in order", i, count)
	}
	bad := 0
	for i, p := range payloads {
		if !rbDefinitelyBad(p) {
			continue
		}
		bad++
		errs := errorsAfter[i]
		if len(errs) != 1 || errs[0].Str("code") != string(protocol.CodeBadFrame) {
			t.Errorf("garbage %d (%q, binary %v) got errors %v, want exactly one bad_frame", i, rbShort(p), binary[i], errs)
		}
	}
	t.Logf("%d garbage messages, %d definitely bad; error codes %v; %d frames back", count, bad, codes, len(res.frames))
	if bad < count/4 {
		t.Fatalf("only %d definitely-bad messages: the generator is broken", bad)
	}

	// The node still serves a new connection.
	fresh, _ := n.connect(t, "tel-fresh")
	hsEcho(t, fresh, "fresh-1", "after the garbage")
	// And the abused one still works too.
	hsPing(t, c, "abused-alive")
}

// TestRobustnessGarbageFirstFrame: garbage as the first frame closes each
// connection with the fatal sequence, and nothing else.
func TestRobustnessGarbageFirstFrame(t *testing.T) {
	n := hsNode(t, nil)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range 40 {
		p, binary := rbGarbage(r)
		if strings.Contains(strings.ToLower(string(p)), `"hello"`) {
			continue // a garbled hello may be answered with auth_failed
		}
		c := n.dial(t)
		var err error
		if binary {
			err = c.SendBinary(p)
		} else {
			err = c.SendRaw(p)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := protocol.CodeBadFrame
		if len(p) > edge.MaxPreHelloBytes {
			want = protocol.CodeTooBig // the bound on a message before hello comes first
		}
		hsExpectFatal(t, c, want, fmt.Sprintf("first frame %d %q", i, rbShort(p)))
	}
	hsWaitConns(t, n, 0)
	c, _ := n.connect(t, "tel-after-first-garbage")
	hsEcho(t, c, "afg-1", "fine")
}

func rbShort(p []byte) string {
	if len(p) > 80 {
		return string(p[:80]) + "..."
	}
	return string(p)
}

func rbLast(fs []client.Frame, k int) []client.Frame { return fs[max(0, len(fs)-k):] }

// rbRaw is a bare WebSocket connection, for control frames the client
// library does not send.
type rbRaw struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func rbDialRaw(t *testing.T, n *node) *rbRaw {
	t.Helper()
	nc, br, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(testCtx(t), n.URL())
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	if br == nil {
		br = bufio.NewReader(nc)
	}
	return &rbRaw{t: t, nc: nc, br: br}
}

func (r *rbRaw) write(op ws.OpCode, fin bool, p []byte) {
	r.t.Helper()
	r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := ws.WriteFrame(r.nc, ws.MaskFrame(ws.NewFrame(op, fin, p))); err != nil {
		r.t.Fatalf("raw write %v: %v", op, err)
	}
}

// read returns the next frame from the server, checking it is unmasked.
func (r *rbRaw) read() (ws.Header, []byte) {
	r.t.Helper()
	h, p, err := r.tryRead()
	if err != nil {
		r.t.Fatalf("raw read: %v", err)
	}
	return h, p
}

func (r *rbRaw) tryRead() (ws.Header, []byte, error) {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	h, err := ws.ReadHeader(r.br)
	if err != nil {
		return h, nil, err
	}
	if h.Masked {
		r.t.Fatalf("the server sent a masked frame: %+v", h)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(r.br, p); err != nil {
		return h, nil, err
	}
	return h, p, nil
}

// TestRobustnessWebSocketPing: a WebSocket ping gets a pong with the same
// payload, before hello, after it, and between the fragments of a message;
// an unsolicited pong is ignored.
func TestRobustnessWebSocketPing(t *testing.T) {
	n := hsNode(t, nil)
	r := rbDialRaw(t, n)

	r.write(ws.OpPing, true, []byte("before-hello"))
	if h, p := r.read(); h.OpCode != ws.OpPong || string(p) != "before-hello" {
		t.Fatalf("ping before hello answered with %v %q", h.OpCode, p)
	}
	r.write(ws.OpText, true, []byte(`{"t":"hello","token":"`+testToken+`","device":{"id":"tel-raw"}}`))
	if h, p := r.read(); h.OpCode != ws.OpText || !strings.Contains(string(p), `"t":"ready"`) {
		t.Fatalf("hello answered with %v %q", h.OpCode, p)
	}
	for _, payload := range [][]byte{nil, []byte("hb-1"), []byte(strings.Repeat("p", 125))} {
		r.write(ws.OpPing, true, payload)
		h, p := r.read()
		if h.OpCode != ws.OpPong || !h.Fin || string(p) != string(payload) {
			t.Fatalf("ping %q answered with %v fin=%v %q", payload, h.OpCode, h.Fin, p)
		}
	}
	// A ping between the fragments of a protocol ping: the pong control
	// frame comes at once, the protocol pong after the last fragment.
	r.write(ws.OpText, false, []byte(`{"t":"ping",`))
	r.write(ws.OpPing, true, []byte("mid"))
	if h, p := r.read(); h.OpCode != ws.OpPong || string(p) != "mid" {
		t.Fatalf("ping between fragments answered with %v %q", h.OpCode, p)
	}
	r.write(ws.OpContinuation, true, []byte(`"ts":"frag"}`))
	if h, p := r.read(); h.OpCode != ws.OpText || string(p) != `{"t":"pong","ts":"frag"}` {
		t.Fatalf("fragmented ping answered with %v %q", h.OpCode, p)
	}
	// An unsolicited pong is ignored.
	r.write(ws.OpPong, true, []byte("unsolicited"))
	r.write(ws.OpText, true, []byte(`{"t":"ping","ts":"after-pong"}`))
	if h, p := r.read(); h.OpCode != ws.OpText || string(p) != `{"t":"pong","ts":"after-pong"}` {
		t.Fatalf("after an unsolicited pong: %v %q", h.OpCode, p)
	}
}

// TestRobustnessWebSocketCloseHandshake: a close frame from the client, after
// hello, is answered with a close frame (RFC 6455 5.5.1: echoing the code),
// then the server drops TCP and releases the connection.
func TestRobustnessWebSocketCloseHandshake(t *testing.T) {
	n := hsNode(t, nil)
	r := rbDialRaw(t, n)
	r.write(ws.OpText, true, []byte(`{"t":"hello","token":"`+testToken+`","device":{"id":"tel-raw-close"}}`))
	if h, p := r.read(); h.OpCode != ws.OpText || !strings.Contains(string(p), `"t":"ready"`) {
		t.Fatalf("hello answered with %v %q", h.OpCode, p)
	}
	r.write(ws.OpClose, true, ws.NewCloseFrameBody(ws.StatusNormalClosure, "bye"))
	h, p, err := r.tryRead()
	if err != nil {
		t.Fatalf("the client's close frame was not answered with a close frame: reading the answer: %v", err)
	}
	if h.OpCode != ws.OpClose {
		t.Fatalf("close answered with %v %q", h.OpCode, p)
	}
	if code, _ := ws.ParseCloseFrameData(p); code != ws.StatusNormalClosure {
		t.Fatalf("close answered with code %d, want 1000", code)
	}
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the closing handshake the server did not drop TCP: %v", err)
	}
	hsWaitConns(t, n, 0)
}

// TestRobustnessClientCloseFreesConnections: connections closed by the
// client's closing handshake, or dropped, are all released.
func TestRobustnessClientCloseFreesConnections(t *testing.T) {
	n := hsNode(t, nil)
	const k = 100
	conns := make([]*client.Conn, k)
	for i := range conns {
		conns[i], _ = n.connect(t, fmt.Sprintf("tel-close-%d", i))
	}
	hsWaitConns(t, n, k)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			if i%2 == 0 {
				c.Close() // closing handshake
			} else {
				c.CloseNow() // TCP drop
			}
		})
	}
	wg.Wait()
	hsWaitConns(t, n, 0)
	c, _ := n.connect(t, "tel-close-0")
	hsEcho(t, c, "close-1", "reconnected")
}

// TestIdleConnectionsCostNoGoroutine: 200 idle connections after hello cost
// the node (almost) no goroutines; closing them brings Conns back to 0.
func TestIdleConnectionsCostNoGoroutine(t *testing.T) {
	const k = 200
	n := hsNode(t, nil)
	warm, _ := n.connect(t, "tel-warm")
	hsPing(t, warm, "warm")
	settle := func() int {
		// Take the lowest of a few samples: transient write goroutines end
		// within milliseconds.
		low := runtime.NumGoroutine()
		for range 10 {
			time.Sleep(20 * time.Millisecond) // the sampling interval of a count that has no event to wait for
			low = min(low, runtime.NumGoroutine())
		}
		return low
	}
	base := settle()

	conns := make([]*client.Conn, k)
	for i := range conns {
		conns[i], _ = n.connect(t, fmt.Sprintf("tel-idle-%03d", i))
	}
	hsWaitConns(t, n, k+1)
	after := settle()
	growth := after - base
	t.Logf("goroutines: %d before, %d with %d more idle connections (growth %d, of which %d client readers)", base, after, k, growth, k)
	if growth >= k+100 {
		t.Fatalf("goroutines grew by %d for %d idle connections: the node spends %d (limit < 100)", growth, k, growth-k)
	}
	// They are all alive.
	for i, c := range conns {
		if i%40 == 0 {
			hsPing(t, c, "idle-"+strconv.Itoa(i))
		}
	}

	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { c.Close() })
	}
	wg.Go(func() { warm.Close() })
	wg.Wait()
	hsWaitConns(t, n, 0)
	deadline := time.Now().Add(5 * time.Second)
	for {
		now := settle()
		if now <= base+10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines stay at %d after closing everything (base %d)", now, base)
		}
	}
}
