package gateway_test

// Black-box tests of the handshake (spec: "Handshake", "hello", "ready",
// "Error codes" and the fatal-error rule): the ready frame, generated and
// truncated device ids, the first-frame rule, the hello timeout, tokens and
// their bindings, the /ws path, and reconnection takeover. Helpers shared with
// robustness_test.go are prefixed hs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// hsSpecReady is the ready frame of the specification's example, verbatim.
const hsSpecReady = `{"t":"ready","v":1,"session":"mobile:tel-1","device":{"id":"tel-1","name":"Phone"},"avatar_url":"https://agent.example.com/avatar/","capabilities":{"text":true,"voice":true,"typing":true,"avatar_states":["idle","thinking","speaking"],"media_in":["image","video","document","audio"],"media_out":["image","voice","video","document","animation"],"prompts":["exec_approval","slash_confirm","clarify"],"edit":true,"max_media_bytes":8388608,"max_text_chars":12000}}`

// hsDocumentedCodes are the error codes of the specification's table.
var hsDocumentedCodes = []string{
	"bad_frame", "auth_failed", "forbidden", "unsupported_frame", "too_big",
	"device_offline", "auth_required", "internal_error",
}

// hsWait is a context bounding one wait for a frame.
func hsWait(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// hsNext returns the next frame on c, failing the test if none comes in 5 s.
func hsNext(t testing.TB, c *client.Conn, what string) client.Frame {
	t.Helper()
	f, err := c.Next(hsWait(t, 5*time.Second))
	if err != nil {
		t.Fatalf("%s: waiting for the next frame: %v (frame %v)", what, err, f)
	}
	return f
}

// hsCheckError asserts that f is an error frame with code and fatal flag.
func hsCheckError(t testing.TB, f client.Frame, code protocol.Code, fatal bool, what string) {
	t.Helper()
	if f.T() != protocol.TypeError {
		t.Fatalf("%s: got %s, want an error frame with code %s", what, f, code)
	}
	if got := f.Str("code"); got != string(code) {
		t.Fatalf("%s: error code %q, want %q (frame %s)", what, got, code, f)
	}
	if _, ok := f.Get("fatal").(bool); !ok {
		t.Fatalf("%s: error frame without a boolean fatal: %s", what, f)
	}
	if f.Bool("fatal") != fatal {
		t.Fatalf("%s: error fatal=%v, want %v (frame %s)", what, f.Bool("fatal"), fatal, f)
	}
	if _, ok := f.Get("message").(string); !ok {
		t.Fatalf("%s: error frame without a string message: %s", what, f)
	}
}

// hsExpectPolicyClose asserts that the very next frame on c is the WebSocket
// close 1008 with reason, and that the server then drops the connection.
func hsExpectPolicyClose(t testing.TB, c *client.Conn, reason string, what string) {
	t.Helper()
	f := hsNext(t, c, what)
	ci := f.Close()
	if ci == nil {
		t.Fatalf("%s: got %s, want the WebSocket close %d %q", what, f, protocol.CloseCode, reason)
	}
	if ci.Code != protocol.CloseCode || ci.Reason != reason {
		t.Fatalf("%s: close %d %q, want %d %q", what, ci.Code, ci.Reason, protocol.CloseCode, reason)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the connection is still open 5 s after the close frame", what)
	}
}

// hsExpectFatal asserts the fatal sequence of the specification: an error
// frame with code and fatal: true, then close 1008 with the code as reason.
func hsExpectFatal(t testing.TB, c *client.Conn, code protocol.Code, what string) {
	t.Helper()
	hsCheckError(t, hsNext(t, c, what), code, true, what)
	hsExpectPolicyClose(t, c, string(code), what)
}

// hsHelloFatal says hello and asserts that it is refused with a fatal code and
// close 1008.
func hsHelloFatal(t testing.TB, c *client.Conn, token string, dev protocol.Device, code protocol.Code, what string) {
	t.Helper()
	ready, err := c.Hello(hsWait(t, 5*time.Second), token, dev, protocol.User{ID: "u-1"})
	var se *client.ServerError
	if !errors.As(err, &se) {
		t.Fatalf("%s: hello answered with %v, %v; want error %s", what, ready, err, code)
	}
	hsCheckError(t, se.Frame, code, true, what)
	hsExpectPolicyClose(t, c, string(code), what)
}

// hsHello says hello and fails the test unless ready comes back.
func hsHello(t testing.TB, c *client.Conn, token string, dev protocol.Device) client.Frame {
	t.Helper()
	ready, err := c.Hello(hsWait(t, 5*time.Second), token, dev, protocol.User{ID: "u-1", Name: "Tester"})
	if err != nil {
		t.Fatalf("hello as %+v: %v", dev, err)
	}
	if ready.T() != protocol.TypeReady {
		t.Fatalf("hello answered with %s", ready)
	}
	return ready
}

// hsPing sends a protocol ping with ts and waits for the pong that echoes it;
// it returns the frames that came before the pong. An error frame or the
// end of the connection before the pong fails the test.
func hsPing(t testing.TB, c *client.Conn, ts string) []client.Frame {
	t.Helper()
	if err := c.Ping(ts); err != nil {
		t.Fatalf("ping %q: %v", ts, err)
	}
	var before []client.Frame
	for {
		f := hsNext(t, c, "waiting for pong "+ts)
		if f.Close() != nil {
			t.Fatalf("connection closed (%s) instead of pong %q; before: %v", f.Close(), ts, before)
		}
		if f.T() == protocol.TypePong && f.Str("ts") == ts {
			return before
		}
		if f.T() == protocol.TypeError {
			t.Fatalf("error frame before pong %q: %s", ts, f)
		}
		before = append(before, f)
	}
}

// hsEcho sends a text and returns the demo agent's reply, reassembled.
func hsEcho(t testing.TB, c *client.Conn, id, text string) string {
	t.Helper()
	if err := c.Text(id, text); err != nil {
		t.Fatalf("text %q: %v", id, err)
	}
	msg, err := c.Expect(hsWait(t, 10*time.Second), protocol.TypeMessage)
	if err != nil {
		t.Fatalf("waiting for the reply to %q: %v", id, err)
	}
	reply, _, err := c.CollectMessage(hsWait(t, 10*time.Second), msg.Str("id"))
	if err != nil {
		t.Fatalf("collecting the reply to %q: %v", id, err)
	}
	if !strings.Contains(reply, text) {
		t.Fatalf("reply %q to %q does not contain the text", reply, id)
	}
	return reply
}

// hsJSON re-decodes v (a received frame or member) with encoding/json into
// plain Go values, for comparison with the specification's examples.
func hsJSON(t testing.TB, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func hsKeys(m map[string]any) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestHandshakeReadyFrame checks every member of ready against the
// specification: v, session, device, avatar_url, and capabilities exactly as
// in the example.
func TestHandshakeReadyFrame(t *testing.T) {
	var spec map[string]any
	if err := json.Unmarshal([]byte(hsSpecReady), &spec); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, ready client.Frame, device, name, avatar string) {
		t.Helper()
		if ready.Err() != nil {
			t.Fatalf("ready is not a JSON object: %v", ready.Err())
		}
		if ready.T() != "ready" {
			t.Fatalf("t = %q", ready.T())
		}
		if v, ok := ready.Get("v").(json.Number); !ok || v.String() != "1" {
			t.Fatalf("v = %#v, want the integer 1", ready.Get("v"))
		}
		if got := ready.Str("session"); got != "mobile:"+device {
			t.Fatalf("session = %q, want %q", got, "mobile:"+device)
		}
		dev := ready.Map("device")
		if dev.IsZero() {
			t.Fatalf("device is not an object: %s", ready)
		}
		if keys := hsKeys(dev.Fields()); !slices.Equal(keys, []string{"id", "name"}) {
			t.Fatalf("device has members %v, want {id,name}", keys)
		}
		if dev.Str("id") != device || dev.Str("name") != name {
			t.Fatalf("device = %s, want id %q name %q", ready.Get("device"), device, name)
		}
		if _, ok := ready.Get("avatar_url").(string); !ok {
			t.Fatalf("avatar_url missing or not a string: %s", ready)
		}
		if got := ready.Str("avatar_url"); got != avatar {
			t.Fatalf("avatar_url = %q, want %q", got, avatar)
		}
		caps := hsJSON(t, ready.Get("capabilities"))
		if !reflect.DeepEqual(caps, spec["capabilities"]) {
			got, _ := json.Marshal(caps)
			want, _ := json.Marshal(spec["capabilities"])
			t.Fatalf("capabilities\n got %s\nwant %s", got, want)
		}
		for _, k := range []string{"t", "v", "session", "device", "avatar_url", "capabilities"} {
			if !ready.Has(k) {
				t.Fatalf("ready lacks %q", k)
			}
		}
	}

	t.Run("avatar url set", func(t *testing.T) {
		n := hsNode(t, func(cfg *gateway.Config) {
			cfg.Edge.AvatarURL = "https://agent.example.com/avatar/"
		})
		c := n.dial(t)
		ready := hsHello(t, c, testToken, protocol.Device{ID: "tel-1", Name: "Phone", Platform: "android", AppVersion: "1.0.0"})
		check(t, ready, "tel-1", "Phone", "https://agent.example.com/avatar/")
		// With the spec's own hello, ready is the spec's example member for
		// member.
		if got := hsJSON(t, ready); !reflect.DeepEqual(got, hsJSON(t, spec)) {
			t.Fatalf("ready\n got %s\nwant %s", ready, hsSpecReady)
		}
	})
	t.Run("avatar url empty by default", func(t *testing.T) {
		n := hsNode(t, nil)
		c := n.dial(t)
		ready := hsHello(t, c, testToken, protocol.Device{ID: "tel-2", Name: "Другой телефон"})
		check(t, ready, "tel-2", "Другой телефон", "")
	})
	t.Run("device without name", func(t *testing.T) {
		n := hsNode(t, nil)
		c := n.dial(t)
		ready := hsHello(t, c, testToken, protocol.Device{ID: "tel-3"})
		check(t, ready, "tel-3", "", "")
	})
}

// TestHandshakeCaseInsensitiveHello: t is case-insensitive, hello included.
func TestHandshakeCaseInsensitiveHello(t *testing.T) {
	n := hsNode(t, nil)
	c := n.dial(t)
	if err := c.SendRaw([]byte(`{"t":"HeLLo","token":"` + testToken + `","device":{"id":"tel-case"}}`)); err != nil {
		t.Fatal(err)
	}
	ready := hsNext(t, c, "hello with t=HeLLo")
	if ready.T() != "ready" || ready.Str("session") != "mobile:tel-case" {
		t.Fatalf("got %s, want ready for tel-case", ready)
	}
	hsPing(t, c, "after-case-hello")
}

// TestHandshakeGeneratedDeviceID: without device.id the server generates
// dev-<hex>, and the session is mobile:dev-<hex>.
func TestHandshakeGeneratedDeviceID(t *testing.T) {
	n := hsNode(t, nil)
	idRE := regexp.MustCompile(`^dev-[0-9a-f]+$`)
	check := func(ready client.Frame, wantName string) string {
		t.Helper()
		id := ready.Map("device").Str("id")
		if !idRE.MatchString(id) {
			t.Fatalf("generated device.id %q does not match %s (ready %s)", id, idRE, ready)
		}
		if got := ready.Str("session"); got != "mobile:"+id {
			t.Fatalf("session %q, want mobile:%s", got, id)
		}
		if got := ready.Map("device").Str("name"); got != wantName {
			t.Fatalf("device.name %q, want %q", got, wantName)
		}
		return id
	}

	// No device member at all.
	c1 := n.dial(t)
	id1 := check(hsHello(t, c1, testToken, protocol.Device{}), "")
	// A device without id keeps its name.
	c2 := n.dial(t)
	id2 := check(hsHello(t, c2, testToken, protocol.Device{Name: "Nameless", Platform: "ios"}), "Nameless")
	// An explicit empty id.
	c3 := n.dial(t)
	if err := c3.SendRaw([]byte(`{"t":"hello","token":"` + testToken + `","device":{"id":""}}`)); err != nil {
		t.Fatal(err)
	}
	id3 := check(hsNext(t, c3, "hello with an empty device.id"), "")

	if id1 == id2 || id2 == id3 || id1 == id3 {
		t.Fatalf("generated ids are not distinct: %q %q %q", id1, id2, id3)
	}
	// All three are live, independent sessions: the agent sees the
	// generated id as the device and the session.
	hsEcho(t, c1, "g-1", "from a generated id")
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "g-1" })
	if ev.Device != id1 || ev.Session != "mobile:"+id1 {
		t.Fatalf("agent event device %q session %q, want %q", ev.Device, ev.Session, id1)
	}
	hsPing(t, c2, "c2-alive")
	hsPing(t, c3, "c3-alive")
}

// TestHandshakeDeviceFieldsTruncated: device strings are cut to 120
// characters (code points, not bytes); exactly 120 stays whole.
func TestHandshakeDeviceFieldsTruncated(t *testing.T) {
	n := hsNode(t, nil)
	cases := []struct {
		name       string
		id, devNm  string
		wantID     string
		wantDevNm  string
		eventCheck bool
	}{
		{"id of 121 ascii", strings.Repeat("a", 120) + "Z", "n", strings.Repeat("a", 120), "n", true},
		{"id of exactly 120", strings.Repeat("b", 119) + "Y", "n", strings.Repeat("b", 119) + "Y", "n", false},
		{"id of 121 cyrillic", strings.Repeat("ж", 120) + "я", "n", strings.Repeat("ж", 120), "n", false},
		{"name of 121 runes", "tel-name", strings.Repeat("é", 120) + "!", "tel-name", strings.Repeat("é", 120), false},
		{"name of exactly 120", "tel-name120", strings.Repeat("x", 120), "tel-name120", strings.Repeat("x", 120), false},
		{"name of 500 emoji", "tel-emoji", strings.Repeat("😀", 500), "tel-emoji", strings.Repeat("😀", 120), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := n.dial(t)
			ready := hsHello(t, c, testToken, protocol.Device{ID: tc.id, Name: tc.devNm, Platform: strings.Repeat("p", 300), AppVersion: strings.Repeat("v", 300)})
			if got := ready.Str("session"); got != "mobile:"+tc.wantID {
				t.Fatalf("session %q (%d chars), want mobile:<%d chars>", got, len([]rune(got)), len([]rune(tc.wantID)))
			}
			if got := ready.Map("device").Str("id"); got != tc.wantID {
				t.Fatalf("device.id %q, want %q", got, tc.wantID)
			}
			if got := ready.Map("device").Str("name"); got != tc.wantDevNm {
				t.Fatalf("device.name has %d chars, want %d", len([]rune(got)), len([]rune(tc.wantDevNm)))
			}
			if tc.eventCheck {
				hsEcho(t, c, "trunc-1", "truncated id")
				ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "trunc-1" })
				if ev.Device != tc.wantID || ev.Session != "mobile:"+tc.wantID {
					t.Fatalf("agent event device %q session %q, want the first 120 characters", ev.Device, ev.Session)
				}
			}
			hsPing(t, c, "alive")
		})
	}
}

// TestHandshakeFirstFrameNotHello: anything but hello first → bad_frame,
// fatal, then close 1008 "bad_frame"; nothing reaches the agent.
func TestHandshakeFirstFrameNotHello(t *testing.T) {
	n := hsNode(t, nil)
	cases := []struct {
		name string
		send func(c *client.Conn) error
	}{
		{"text", func(c *client.Conn) error { return c.Text("pre-1", "before hello") }},
		{"ping", func(c *client.Conn) error { return c.Ping("pre") }},
		{"typing", func(c *client.Conn) error { return c.Typing() }},
		{"ack", func(c *client.Conn) error { return c.Ack("x") }},
		{"unknown type", func(c *client.Conn) error { return c.SendRaw([]byte(`{"t":"future","x":1}`)) }},
		{"invalid json", func(c *client.Conn) error { return c.SendRaw([]byte(`{"t":"hello","token":`)) }},
		{"not an object", func(c *client.Conn) error { return c.SendRaw([]byte(`["hello"]`)) }},
		{"no t", func(c *client.Conn) error { return c.SendRaw([]byte(`{"token":"` + testToken + `"}`)) }},
		{"invalid utf-8", func(c *client.Conn) error {
			return c.SendRaw([]byte("{\"t\":\"hello\",\"token\":\"" + testToken + "\",\"device\":{\"name\":\"\xff\"}}"))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := n.dial(t)
			if err := tc.send(c); err != nil {
				t.Fatal(err)
			}
			hsExpectFatal(t, c, protocol.CodeBadFrame, tc.name+" before hello")
		})
	}
	if got := n.agent.count(func(wire.Event) bool { return true }); got != 0 {
		t.Fatalf("the agent received %d events from connections that never said hello: %+v", got, n.agent.Events())
	}
}

// TestHandshakeHelloTimeout: no hello within HelloTimeout → a fatal error and
// close 1008 with the code as reason; a hello in time stops the timer.
func TestHandshakeHelloTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	n := hsNode(t, func(cfg *gateway.Config) { cfg.Edge.HelloTimeout = timeout })

	expectTimeout := func(t *testing.T, c *client.Conn, start time.Time) {
		t.Helper()
		f := hsNext(t, c, "hello timeout")
		elapsed := time.Since(start)
		if f.T() != protocol.TypeError {
			t.Fatalf("got %s, want a fatal error", f)
		}
		code := f.Str("code")
		if !slices.Contains(hsDocumentedCodes, code) {
			t.Fatalf("hello timeout error code %q is not a documented code", code)
		}
		t.Logf("hello timeout: %s after %v", f, elapsed)
		hsCheckError(t, f, protocol.Code(code), true, "hello timeout")
		if elapsed < timeout-100*time.Millisecond || elapsed > timeout+2*time.Second {
			t.Fatalf("hello timeout fired after %v, configured %v", elapsed, timeout)
		}
		hsExpectPolicyClose(t, c, code, "hello timeout")
	}

	t.Run("silent", func(t *testing.T) {
		c := n.dial(t)
		expectTimeout(t, c, time.Now())
	})
	t.Run("half-sent hello does not extend it", func(t *testing.T) {
		c := n.dial(t)
		start := time.Now()
		hello := []byte(`{"t":"hello","token":"` + testToken + `","device":{"id":"tel-slow"}}`)
		if err := c.SendHeaderOnly(int64(len(hello))); err != nil {
			t.Fatal(err)
		}
		if err := c.SendPayload(hello[:10]); err != nil {
			t.Fatal(err)
		}
		expectTimeout(t, c, start)
	})
	t.Run("hello in time stops the timer", func(t *testing.T) {
		// A node of its own with a longer timeout, so that the hello, sent
		// at once, is in time however busy the machine is.
		const timeout = time.Second
		n := hsNode(t, func(cfg *gateway.Config) { cfg.Edge.HelloTimeout = timeout })
		c := n.dial(t)
		hsHello(t, c, testToken, protocol.Device{ID: "tel-in-time"})
		// Idle for well past the hello timeout: the session must stay.
		time.Sleep(2 * timeout) // the idle time is what is tested: no timer may fire in it
		if err := c.Err(); err != nil {
			t.Fatalf("connection ended after a timely hello: %v", err)
		}
		if before := hsPing(t, c, "still-here"); len(before) != 0 {
			t.Fatalf("frames before pong: %v", before)
		}
	})
}

// TestHandshakeHelloTimeoutDefault: a zero HelloTimeout means the spec's 15 s.
// It takes 15 s of wall time, so it runs in parallel and not with -short.
func TestHandshakeHelloTimeoutDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 15 s default hello timeout")
	}
	t.Parallel()
	if protocol.HelloTimeout != 15*time.Second {
		t.Fatalf("protocol.HelloTimeout = %v, the spec says 15 s", protocol.HelloTimeout)
	}
	n := hsNode(t, func(cfg *gateway.Config) { cfg.Edge.HelloTimeout = 0 })
	c := n.dial(t)
	start := time.Now()
	// Still open shortly before 15 s.
	ctx, cancel := context.WithTimeout(context.Background(), protocol.HelloTimeout-time.Second)
	f, err := c.Next(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after %v without hello: %v, %v; want nothing before 15 s", time.Since(start), f, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	f, err = c.Next(ctx)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("no fatal error by %v after connecting without hello: %v", elapsed, err)
	}
	if elapsed < protocol.HelloTimeout-time.Second || elapsed > protocol.HelloTimeout+2*time.Second {
		t.Fatalf("hello timeout after %v, want 15 s", elapsed)
	}
	code := f.Str("code")
	hsCheckError(t, f, protocol.Code(code), true, "default hello timeout")
	hsExpectPolicyClose(t, c, code, "default hello timeout")
}

// TestHandshakeRepeatedHello: a second hello is bad_frame, not fatal; the
// session keeps its device and keeps working.
func TestHandshakeRepeatedHello(t *testing.T) {
	n := hsNode(t, nil)
	c, _ := n.connect(t, "tel-rep")
	for i, raw := range []string{
		`{"t":"hello","token":"` + testToken + `","device":{"id":"tel-rep"}}`,
		`{"t":"hello","token":"` + testToken + `","device":{"id":"tel-other"}}`,
		`{"t":"hello","token":"wrong-token","device":{"id":"tel-rep"}}`,
		`{"t":"HELLO"}`,
	} {
		if err := c.SendRaw([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		f := hsNext(t, c, "repeated hello")
		hsCheckError(t, f, protocol.CodeBadFrame, false, "repeated hello "+raw)
		if before := hsPing(t, c, "after-hello-"+string(rune('0'+i))); len(before) != 0 {
			t.Fatalf("frames between the error and the pong: %v", before)
		}
	}
	// The session is still tel-rep.
	hsEcho(t, c, "rep-1", "still me")
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "rep-1" })
	if ev.Device != "tel-rep" || ev.Session != "mobile:tel-rep" {
		t.Fatalf("after repeated hellos the agent sees device %q session %q", ev.Device, ev.Session)
	}
}

// TestHandshakeAuthFailed: a wrong or missing token → auth_failed, fatal,
// close 1008 "auth_failed".
func TestHandshakeAuthFailed(t *testing.T) {
	n := hsNode(t, nil)
	for _, tok := range []string{"wrong", "", "TEST-TOKEN", testToken[:len(testToken)-1], testToken + "x", " " + testToken, testToken + "\n"} {
		t.Run("token "+hsQuote(tok), func(t *testing.T) {
			c := n.dial(t)
			hsHelloFatal(t, c, tok, protocol.Device{ID: "tel-1"}, protocol.CodeAuthFailed, "token "+hsQuote(tok))
		})
	}
	t.Run("no token member", func(t *testing.T) {
		c := n.dial(t)
		if err := c.SendRaw([]byte(`{"t":"hello","device":{"id":"tel-1"}}`)); err != nil {
			t.Fatal(err)
		}
		hsExpectFatal(t, c, protocol.CodeAuthFailed, "hello without token")
	})
	t.Run("null token", func(t *testing.T) {
		c := n.dial(t)
		if err := c.SendRaw([]byte(`{"t":"hello","token":null,"device":{"id":"tel-1"}}`)); err != nil {
			t.Fatal(err)
		}
		hsExpectFatal(t, c, protocol.CodeAuthFailed, "hello with a null token")
	})
	if got := n.agent.count(func(wire.Event) bool { return true }); got != 0 {
		t.Fatalf("agent got events: %+v", n.agent.Events())
	}
	hsWaitConns(t, n, 0)
}

func hsQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// hsNode is startNode plus one more check at the end of the test: once the
// test's sockets are dropped (their cleanups run before this one), the edge
// must release every connection within 5 s, before the node is closed.
func hsNode(t testing.TB, mutate func(*gateway.Config)) *node {
	t.Helper()
	n := startNode(t, mutate)
	t.Cleanup(func() {
		testsvc.Eventually(5*time.Second, func() bool { return n.Edge.Conns() == 0 }) // judged below
		if k := n.Edge.Conns(); k != 0 {
			t.Errorf("%d connections were never released by the edge after the test dropped its sockets", k)
		}
	})
	return n
}

// hsWaitConns waits until the edge has want open connections.
func hsWaitConns(t testing.TB, n *node, want int) {
	t.Helper()
	testsvc.WaitFor(t, 5*time.Second, fmt.Sprintf("the edge to have %d open connections", want), func() bool { return n.Edge.Conns() == want })
}

// TestHandshakeTokenInURLIgnored: ?token= is not accepted; only hello.token
// counts, whatever the query says.
func TestHandshakeTokenInURLIgnored(t *testing.T) {
	n := hsNode(t, nil)
	dial := func(t *testing.T, url string) *client.Conn {
		c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("dial %s: %v", url, err)
		}
		t.Cleanup(func() { c.CloseNow() })
		return c
	}
	t.Run("token only in the url", func(t *testing.T) {
		c := dial(t, n.URL()+"?token="+testToken)
		hsHelloFatal(t, c, "", protocol.Device{ID: "tel-url"}, protocol.CodeAuthFailed, "token only in the url")
	})
	t.Run("token in the url, wrong token in hello", func(t *testing.T) {
		c := dial(t, n.URL()+"?token="+testToken)
		hsHelloFatal(t, c, "wrong", protocol.Device{ID: "tel-url"}, protocol.CodeAuthFailed, "url token, wrong hello token")
	})
	t.Run("token in hello, anything in the url", func(t *testing.T) {
		c := dial(t, n.URL()+"?token=wrong&x=1")
		ready := hsHello(t, c, testToken, protocol.Device{ID: "tel-url"})
		if ready.Str("session") != "mobile:tel-url" {
			t.Fatalf("ready %s", ready)
		}
	})
}

// TestHandshakeWrongPath: the WebSocket is at /ws only; other paths are
// refused at the HTTP level with 404.
func TestHandshakeWrongPath(t *testing.T) {
	n := hsNode(t, nil)
	base := "ws://" + n.Addr().String()
	for _, path := range []string{"/", "/other", "/ws/", "/ws/extra", "/wss", "/WS", "/api/ws"} {
		t.Run(path, func(t *testing.T) {
			c, err := client.Dial(testCtx(t), base+path, client.Options{Timeout: 5 * time.Second})
			if err == nil {
				c.CloseNow()
				t.Fatalf("dial %s succeeded, want the handshake refused", path)
			}
			var he *client.HandshakeError
			if !errors.As(err, &he) || he.Status != 404 {
				t.Fatalf("dial %s: %v, want HTTP 404", path, err)
			}
		})
	}
	if n.Edge.Conns() != 0 {
		t.Fatalf("refused handshakes left %d connections", n.Edge.Conns())
	}
	// The right path, with a query string, works.
	c, err := client.Dial(testCtx(t), base+"/ws?v=1", client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("dial /ws?v=1: %v", err)
	}
	defer c.CloseNow()
	hsHello(t, c, testToken, protocol.Device{ID: "tel-path"})
}

// TestHandshakeAllowedDevices: with MOBILE_ALLOWED_DEVICES only the listed
// device ids connect; others get auth_failed and close 1008.
func TestHandshakeAllowedDevices(t *testing.T) {
	n := hsNode(t, func(cfg *gateway.Config) {
		cfg.Edge.Auth.AllowedDevices = []string{"tel-ok", "tel-ok-2"}
	})
	c, ready := n.connect(t, "tel-ok")
	if ready.Str("session") != "mobile:tel-ok" {
		t.Fatalf("ready %s", ready)
	}
	hsEcho(t, c, "al-1", "allowed")
	c2, _ := n.connect(t, "tel-ok-2")
	hsPing(t, c2, "ok-2")

	for _, dev := range []protocol.Device{{ID: "tel-bad"}, {ID: "TEL-OK"}, {ID: "tel-ok "}, {Name: "no id"}} {
		t.Run("device "+hsQuote(dev.ID), func(t *testing.T) {
			c := n.dial(t)
			hsHelloFatal(t, c, testToken, dev, protocol.CodeAuthFailed, "device "+dev.ID)
		})
	}
	// The allowed sessions were not disturbed.
	hsPing(t, c, "still-ok")
	hsPing(t, c2, "still-ok-2")
}

// TestHandshakeExtraTokens: a MOBILE_EXTRA_TOKENS token connects only as its
// device, and its device only with it; violations are forbidden + 1008.
func TestHandshakeExtraTokens(t *testing.T) {
	const bound, boundTok = "tel-bound", "bound-secret"
	n := hsNode(t, func(cfg *gateway.Config) {
		cfg.Edge.Auth.ExtraTokens = map[string]secret.Secret{bound: boundTok, "tel-bound-2": "second-secret"}
		cfg.Edge.Auth.DeliverTokens = []secret.Secret{"deliver-secret"}
	})

	c := n.dial(t)
	ready := hsHello(t, c, boundTok, protocol.Device{ID: bound, Name: "Bound"})
	if ready.Str("session") != "mobile:"+bound {
		t.Fatalf("ready %s", ready)
	}
	hsEcho(t, c, "b-1", "bound device")

	refused := []struct {
		name  string
		token string
		dev   protocol.Device
	}{
		{"bound device with the main token", testToken, protocol.Device{ID: bound}},
		{"bound device with another bound token", "second-secret", protocol.Device{ID: bound}},
		{"bound device with a deliver token", "deliver-secret", protocol.Device{ID: bound}},
		{"bound token with another device", boundTok, protocol.Device{ID: "tel-thief"}},
		{"bound token with the main token's device", boundTok, protocol.Device{ID: "tel-1"}},
		{"bound token without a device id", boundTok, protocol.Device{Name: "anon"}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			c := n.dial(t)
			hsHelloFatal(t, c, tc.token, tc.dev, protocol.CodeForbidden, tc.name)
		})
	}
	// The refused attempts did not take the bound device's session over
	// (hsPing fails on a close or an error frame).
	hsPing(t, c, "bound-alive")
	// The main token still connects as any unbound device.
	other, _ := n.connect(t, "tel-1")
	hsPing(t, other, "main-alive")
	// A wrong token for the bound device is auth_failed, not forbidden.
	cw := n.dial(t)
	hsHelloFatal(t, cw, "nope", protocol.Device{ID: bound}, protocol.CodeAuthFailed, "bound device with an invalid token")

	// The bound device with its own token again is a reconnection: the
	// first socket is closed (1000) and the new one works.
	c2 := n.dial(t)
	hsHello(t, c2, boundTok, protocol.Device{ID: bound, Name: "Bound again"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if ci, err := c.ExpectClose(ctx); err != nil || ci.Code != 1000 {
		t.Fatalf("bound reconnection: the first socket got %v, %v; want close 1000 within 1 s", ci, err)
	}
	hsEcho(t, c2, "b-2", "bound device reconnected")
}

// TestHandshakeDeliverToken: a MOBILE_DELIVER_TOKENS token authenticates a
// hello like the app token.
func TestHandshakeDeliverToken(t *testing.T) {
	n := hsNode(t, func(cfg *gateway.Config) {
		cfg.Edge.Auth.DeliverTokens = []secret.Secret{"deliver-secret", "deliver-2"}
	})
	for _, tok := range []string{"deliver-secret", "deliver-2"} {
		c := n.dial(t)
		ready := hsHello(t, c, tok, protocol.Device{ID: "cron-" + tok})
		if ready.Str("session") != "mobile:cron-"+tok {
			t.Fatalf("ready %s", ready)
		}
		hsPing(t, c, "cron-alive")
	}
	c := n.dial(t)
	hsHelloFatal(t, c, "deliver-secret-x", protocol.Device{ID: "cron-x"}, protocol.CodeAuthFailed, "a near-miss deliver token")
}

// TestHandshakeReconnectTakeover: the same device and token on a second
// socket closes the first with 1000 within 1 s; the second works and gets
// the agent's replies, including one the agent was still working on.
func TestHandshakeReconnectTakeover(t *testing.T) {
	release := make(chan struct{})
	var once bool
	n := hsNode(t, func(cfg *gateway.Config) {
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Kind == wire.EventText && ev.Text == "hold" {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return agent.Demo{}.Handle(ctx, ev, out)
		})
	})
	t.Cleanup(func() {
		if !once {
			close(release)
		}
	})
	c1, _ := n.connect(t, "tel-take")
	hsEcho(t, c1, "t-0", "first socket")
	if err := c1.Text("t-1", "hold"); err != nil {
		t.Fatal(err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "t-1" })

	c2, ready := n.connect(t, "tel-take")
	if ready.Str("session") != "mobile:tel-take" {
		t.Fatalf("ready %s", ready)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ci, err := c1.ExpectClose(ctx)
	if err != nil {
		t.Fatalf("the first socket was not closed within 1 s of the takeover: %v", err)
	}
	if ci.Code != 1000 {
		t.Fatalf("the first socket was closed with %s, want 1000", ci)
	}
	select {
	case <-c1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the first socket stays open after its close frame")
	}

	// The reply the agent was working on goes to the new socket.
	once = true
	close(release)
	msg, err := c2.Expect(hsWait(t, 10*time.Second), protocol.TypeMessage)
	if err != nil {
		t.Fatalf("the held reply never reached the new socket: %v", err)
	}
	text, _, err := c2.CollectMessage(hsWait(t, 10*time.Second), msg.Str("id"))
	if err != nil || !strings.Contains(text, "hold") {
		t.Fatalf("held reply on the new socket: %q, %v", text, err)
	}
	// And the new socket works on its own.
	hsEcho(t, c2, "t-2", "second socket")
	hsWaitConns(t, n, 1)
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "t-2" })
	if ev.Device != "tel-take" {
		t.Fatalf("agent event %+v", ev)
	}

	// A third takeover, without any traffic in between, also closes c2.
	c3, _ := n.connect(t, "tel-take")
	ctx3, cancel3 := context.WithTimeout(context.Background(), time.Second)
	defer cancel3()
	if ci, err := c2.ExpectClose(ctx3); err != nil || ci.Code != 1000 {
		t.Fatalf("second takeover: close %v, %v; want 1000 within 1 s", ci, err)
	}
	hsEcho(t, c3, "t-3", "third socket")
}

// TestHandshakeTwoDevicesIndependent: sockets of different devices do not
// replace each other and each gets only its own replies.
func TestHandshakeTwoDevicesIndependent(t *testing.T) {
	n := hsNode(t, nil)
	a, _ := n.connect(t, "tel-a")
	b, _ := n.connect(t, "tel-b")
	hsPing(t, a, "a-alive")
	hsPing(t, b, "b-alive")

	replyA := hsEcho(t, a, "x-1", "only for A")
	replyB := hsEcho(t, b, "x-1", "only for B") // the same id on another device is not a duplicate
	if strings.Contains(replyA, "for B") || strings.Contains(replyB, "for A") {
		t.Fatalf("crossed replies: A %q, B %q", replyA, replyB)
	}
	for _, tc := range []struct {
		c     *client.Conn
		other string
	}{{a, "only for B"}, {b, "only for A"}} {
		for _, f := range hsPing(t, tc.c, "final") {
			if strings.Contains(f.String(), tc.other) {
				t.Fatalf("a socket got the other device's frame %s", f)
			}
		}
	}
	for _, dev := range []string{"tel-a", "tel-b"} {
		if got := n.agent.count(func(ev wire.Event) bool { return ev.ID == "x-1" && ev.Device == dev }); got != 1 {
			t.Fatalf("agent got %d events x-1 from %s, want 1", got, dev)
		}
	}
	if n.Edge.Conns() != 2 {
		t.Fatalf("edge has %d connections, want 2", n.Edge.Conns())
	}
}

// TestEventAuth: every event names the token that admitted its device (the
// agent's identity of the sender); hello.user is passed on as a claim only.
func TestEventAuth(t *testing.T) {
	type seen struct{ device, auth, userID string }
	events := make(chan seen, 8)
	n := hsNode(t, func(cfg *gateway.Config) {
		cfg.Edge.Auth.ExtraTokens = map[string]secret.Secret{"tel-bound": "bound-secret"}
		cfg.Edge.Auth.DeliverTokens = []secret.Secret{"deliver-secret"}
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			events <- seen{ev.Device, ev.Auth, ev.UserID}
			return nil
		})
	})
	for _, tc := range []struct{ token, device, want string }{
		{"bound-secret", "tel-bound", "device"},
		{testToken, "tel-app", "app"},
		{"deliver-secret", "tel-cron", "deliver"},
	} {
		c := n.dial(t)
		if err := c.Send(map[string]any{"t": "hello", "token": tc.token, "device": protocol.Device{ID: tc.device},
			"user": map[string]string{"id": "the-owner", "name": "Owner"}}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := c.Expect(ctx, protocol.TypeReady); err != nil {
			t.Fatalf("%s: %v", tc.device, err)
		}
		cancel()
		if err := c.Text("m-1", "hi"); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-events:
			if got != (seen{tc.device, tc.want, "the-owner"}) {
				t.Fatalf("event %+v, want device %s auth %s (user_id the claim)", got, tc.device, tc.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no event", tc.device)
		}
	}
}
