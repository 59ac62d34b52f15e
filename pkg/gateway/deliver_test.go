package gateway_test

// Service delivery: the deliver frame of cron and "hermes send". The spec
// ("Other client frames" and the paragraph below it): deliver carries id,
// target?, text?, media? (at least text or media); an empty target means
// MOBILE_HOME_DEVICE; a target that is not online gets device_offline. It is
// accepted only from a loopback client or a connection with a token from
// MOBILE_DELIVER_TOKENS; everybody else gets error forbidden.

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

const dlvToken = "deliver-secret"

// dlvService dials with opts and says hello as device with token: a service
// connection (cron) or an ordinary one, depending on where it comes from.
func dlvService(t *testing.T, n *node, opts client.Options, token, device string) *client.Conn {
	t.Helper()
	c := n.dial(t, opts)
	if _, err := c.Hello(testCtx(t), token, protocol.Device{ID: device, Name: device}, protocol.User{ID: "svc"}); err != nil {
		t.Fatalf("hello as %q: %v", device, err)
	}
	return c
}

// dlvCron is a service connection straight from 127.0.0.1, no headers.
func dlvCron(t *testing.T, n *node) *client.Conn {
	t.Helper()
	return dlvService(t, n, client.Options{}, testToken, "cron")
}

// dlvXFF is a handshake header naming the client.
func dlvXFF(v string) client.Options {
	return client.Options{Header: http.Header{"X-Forwarded-For": {v}}}
}

// dlvOK checks that c's last deliver went through: the next answer the
// server sends c is delivered, not an error. (A deliver is answered when
// the phone has it, while a ping is answered at once, so a pong says
// nothing about a deliver sent before it.)
func dlvOK(t *testing.T, c *client.Conn) {
	t.Helper()
	ctx := testCtx(t)
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for delivered: %v", err)
		}
		switch f.T() {
		case protocol.TypeError:
			t.Fatalf("deliver was answered with an error: %s", f)
		case protocol.TypeDelivered:
			return
		case "":
			t.Fatalf("connection closed while waiting for delivered: %s", f)
		}
	}
}

// dlvAlive checks that c is still served and sent no error meanwhile: a
// ping sent now is answered, and nothing before the pong is an error.
func dlvAlive(t *testing.T, c *client.Conn) {
	t.Helper()
	ctx := testCtx(t)
	if err := c.Ping(7); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for pong: %v", err)
		}
		switch f.T() {
		case protocol.TypeError:
			t.Fatalf("unexpected error: %s", f)
		case protocol.TypePong:
			if f.Int("ts") != 7 {
				t.Fatalf("pong ts = %s, want 7", f)
			}
			return
		case "":
			t.Fatalf("connection closed while waiting for pong: %s", f)
		}
	}
}

// dlvError expects the next error frame on c to carry code and not be fatal,
// and the connection to stay usable (a ping is answered afterwards).
func dlvError(t *testing.T, c *client.Conn, code protocol.Code) {
	t.Helper()
	f, err := c.Expect(testCtx(t), protocol.TypeError)
	if err != nil {
		t.Fatalf("waiting for error %s: %v", code, err)
	}
	if got := protocol.Code(f.Str("code")); got != code {
		t.Fatalf("error code = %q, want %q: %s", got, code, f)
	}
	if f.Bool("fatal") {
		t.Fatalf("error %s must not be fatal: %s", code, f)
	}
	dlvAlive(t, c) // the connection keeps working
}

// dlvMessage waits on dev for the next agent message and reassembles it
// from its chunks (same id, in order, until final:true; an edit with chunk
// index 0 starts the text anew, as in a streamed answer). Frames of other
// types before and between the chunks are skipped.
func dlvMessage(t *testing.T, dev *client.Conn) (string, []client.Frame) {
	t.Helper()
	ctx := testCtx(t)
	var (
		id     string
		text   strings.Builder
		frames []client.Frame // the chunks of the current version
	)
	for {
		f, err := dev.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for a delivered message (%d chunks so far): %v", len(frames), err)
		}
		switch f.T() {
		case "":
			t.Fatalf("device connection closed: %s", f)
		case protocol.TypeMessage:
		default:
			continue
		}
		if id == "" {
			id = f.Str("id")
		} else if f.Str("id") != id {
			t.Fatalf("message %q interleaved with the chunks of %q", f.Str("id"), id)
		}
		ch := f.Map("chunk")
		if f.Bool("edit") && ch.Int("index") == 0 {
			text.Reset()
			frames = nil
		}
		if ch.IsZero() || ch.Int("index") != len(frames) {
			t.Fatalf("chunk %d due, got %s", len(frames), f)
		}
		frames = append(frames, f)
		text.WriteString(f.Str("text"))
		if f.Bool("final") {
			if total := ch.Int("total"); total != len(frames) {
				t.Fatalf("final chunk says total %d after %d chunks", total, len(frames))
			}
			return text.String(), frames
		}
	}
}

// dlvMedia waits on dev for the next media file and reassembles it: the
// first chunk (meta) and the decoded bytes of all chunks.
func dlvMedia(t *testing.T, dev *client.Conn) (client.Frame, []byte) {
	t.Helper()
	ctx := testCtx(t)
	var (
		meta  client.Frame
		data  []byte
		parts int
	)
	for {
		f, err := dev.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for delivered media: %v", err)
		}
		switch f.T() {
		case "":
			t.Fatalf("device connection closed: %s", f)
		case protocol.TypeMedia:
		default:
			continue
		}
		if meta.IsZero() {
			meta = f
		}
		if f.Str("id") != meta.Str("id") || f.Int("part") != parts {
			t.Fatalf("media part %d of %q due, got %s", parts, meta.Str("id"), f)
		}
		parts++
		data = append(data, dlvDecode(t, f)...)
		if f.Bool("final") {
			if f.Int("parts") != parts || f.Int("size") != len(data) {
				t.Fatalf("final media chunk says parts %d size %d; got %d parts, %d bytes", f.Int("parts"), f.Int("size"), parts, len(data))
			}
			return meta, data
		}
	}
}

// dlvExpectText waits for a delivered message on dev and checks its text.
func dlvExpectText(t *testing.T, dev *client.Conn, want string) {
	t.Helper()
	text, frames := dlvMessage(t, dev)
	if text != want {
		t.Fatalf("device got message %q, want %q (%d frames)", text, want, len(frames))
	}
}

// dlvNothingBefore proves that no message or media reached dev before a
// marker: it delivers marker to target through sender (which must be
// allowed to) and reads dev up to it. The refused deliver was answered
// before the marker was sent, and a deliver is answered only once its frames
// are written, so anything it delivered would come first.
func dlvNothingBefore(t *testing.T, dev, sender *client.Conn, target string) {
	t.Helper()
	const marker = "marker: nothing before me"
	if err := sender.Deliver("marker", target, marker, nil); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for {
		f, err := dev.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the marker: %v", err)
		}
		switch f.T() {
		case protocol.TypeMessage:
			if f.Str("text") == marker {
				return
			}
			t.Fatalf("a refused deliver reached the device: %s", f)
		case protocol.TypeMedia:
			t.Fatalf("a refused deliver reached the device: %s", f)
		case "":
			t.Fatalf("device connection closed: %s", f)
		}
	}
}

func TestDeliverTextToMobileTarget(t *testing.T) {
	n := startNode(t, nil)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)
	if err := cron.SendRaw([]byte(`{"t":"deliver","id":"d1","target":"mobile:tel-1","text":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	text, frames := dlvMessage(t, dev)
	if text != "hi" || len(frames) != 1 {
		t.Fatalf("device got %q in %d frames, want \"hi\" in one: %v", text, len(frames), frames)
	}
	f := frames[0]
	if f.Str("id") == "" || !f.Bool("final") {
		t.Fatalf("message frame needs an id and final:true: %s", f)
	}
	if ch := f.Map("chunk"); ch.IsZero() || ch.Int("index") != 0 || ch.Int("total") != 1 {
		t.Fatalf("chunk = %v, want {index:0,total:1}: %s", ch, f)
	}
	dlvOK(t, cron)
	// A delivery is not a message from the user: the agent hears nothing.
	if got := n.agent.Events(); len(got) != 0 {
		t.Fatalf("the agent received %+v for a deliver", got)
	}
}

func TestDeliverBareTarget(t *testing.T) {
	n := startNode(t, nil)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)
	if err := cron.Deliver("d1", "tel-1", "bare target", nil); err != nil {
		t.Fatal(err)
	}
	dlvExpectText(t, dev, "bare target")
	dlvOK(t, cron)
}

func TestDeliverEmptyTargetGoesHome(t *testing.T) {
	n := startNode(t, func(c *gateway.Config) { c.Edge.HomeDevice = "tel-home" })
	home, _ := n.connect(t, "tel-home")
	other, _ := n.connect(t, "tel-other")
	cron := dlvCron(t, n)
	if err := cron.SendRaw([]byte(`{"t":"deliver","id":"d1","text":"to home"}`)); err != nil {
		t.Fatal(err)
	}
	dlvExpectText(t, home, "to home")
	dlvOK(t, cron)
	// Only the home device got it.
	dlvNothingBefore(t, other, cron, "mobile:tel-other")
}

func TestDeliverEmptyTargetWithoutHomeIsBadFrame(t *testing.T) {
	n := startNode(t, nil) // no HomeDevice
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)
	if err := cron.SendRaw([]byte(`{"t":"deliver","id":"d1","text":"nowhere"}`)); err != nil {
		t.Fatal(err)
	}
	dlvError(t, cron, protocol.CodeBadFrame)
	if err := cron.SendRaw([]byte(`{"t":"deliver","id":"d2","target":"","text":"nowhere"}`)); err != nil {
		t.Fatal(err)
	}
	dlvError(t, cron, protocol.CodeBadFrame)
	dlvNothingBefore(t, dev, cron, "mobile:tel-1")
}

func TestDeliverWithoutTextOrMediaIsBadFrame(t *testing.T) {
	n := startNode(t, nil)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)
	for _, raw := range []string{
		`{"t":"deliver","id":"d1","target":"mobile:tel-1"}`,
		`{"t":"deliver","id":"d2","target":"mobile:tel-1","text":""}`,
	} {
		if err := cron.SendRaw([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		dlvError(t, cron, protocol.CodeBadFrame)
	}
	dlvNothingBefore(t, dev, cron, "mobile:tel-1")
}

func TestDeliverMedia(t *testing.T) {
	n := startNode(t, nil)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)
	png := append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000)...)
	err := cron.Deliver("d1", "mobile:tel-1", "", &client.DeliverMedia{
		Kind: "image", Mime: "image/png", Filename: "chart.png", Data: png,
	})
	if err != nil {
		t.Fatal(err)
	}
	meta, data := dlvMedia(t, dev)
	if meta.Str("kind") != "image" || meta.Str("mime") != "image/png" || meta.Str("filename") != "chart.png" {
		t.Fatalf("media frame kind/mime/filename = %q/%q/%q: %s", meta.Str("kind"), meta.Str("mime"), meta.Str("filename"), meta)
	}
	if meta.Int("size") != len(png) || meta.Int("parts") != 1 || meta.Int("part") != 0 || !meta.Bool("final") {
		t.Fatalf("media frame size/part/parts/final wrong for %d bytes: %s", len(png), meta)
	}
	if !bytes.Equal(data, png) {
		t.Fatalf("device got %d bytes, not the %d delivered", len(data), len(png))
	}
	dlvOK(t, cron)
}

func dlvDecode(t *testing.T, f client.Frame) []byte {
	t.Helper()
	if !f.Has("data") {
		t.Fatalf("media frame carries no data: %s", f)
	}
	b, err := base64.StdEncoding.DecodeString(f.Str("data"))
	if err != nil {
		t.Fatalf("media data is not base64: %v", err)
	}
	return b
}

func TestDeliverTextAndMedia(t *testing.T) {
	n := startNode(t, nil)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)
	doc := []byte("%PDF-1.4 report")
	err := cron.Deliver("d1", "mobile:tel-1", "your report", &client.DeliverMedia{
		Kind: "document", Mime: "application/pdf", Filename: "report.pdf", Data: doc,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	var gotText, gotMedia bool
	for !gotText || !gotMedia {
		f, err := dev.Next(ctx)
		if err != nil {
			t.Fatalf("text %v media %v: %v", gotText, gotMedia, err)
		}
		switch f.T() {
		case protocol.TypeMessage:
			if f.Str("text") != "your report" || !f.Bool("final") {
				t.Fatalf("message = %s", f)
			}
			gotText = true
		case protocol.TypeMedia:
			if f.Str("kind") != "document" || f.Str("filename") != "report.pdf" || !f.Bool("final") || !bytes.Equal(dlvDecode(t, f), doc) {
				t.Fatalf("media = %s", f)
			}
			gotMedia = true
		}
	}
	dlvOK(t, cron)
}

func TestDeliverMediaKindNotInMediaOut(t *testing.T) {
	n := startNode(t, nil)
	dev, ready := n.connect(t, "tel-1")
	out := ready.Map("capabilities").Slice("media_out")
	for _, kind := range []string{"audio", "sticker"} {
		for _, k := range out {
			if k == kind {
				t.Fatalf("media_out %v lists %q; the test needs kinds outside it", out, kind)
			}
		}
	}
	cron := dlvCron(t, n)
	for _, kind := range []string{"audio", "sticker"} {
		err := cron.Deliver("d-"+kind, "mobile:tel-1", "", &client.DeliverMedia{Kind: kind, Mime: "application/octet-stream", Data: []byte("bytes")})
		if err != nil {
			t.Fatal(err)
		}
		dlvError(t, cron, protocol.CodeUnsupportedFrame)
	}
	dlvNothingBefore(t, dev, cron, "mobile:tel-1")
}

func TestDeliverTextLimit(t *testing.T) {
	n := startNode(t, nil)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)

	if err := cron.Deliver("d-big", "mobile:tel-1", strings.Repeat("a", protocol.MaxTextChars+1), nil); err != nil {
		t.Fatal(err)
	}
	dlvError(t, cron, protocol.CodeTooBig)
	dlvNothingBefore(t, dev, cron, "mobile:tel-1")

	// The limit counts characters: 12000 two-byte characters are fine, and
	// arrive cut into message chunks of one id that join back to the text.
	max := strings.Repeat("é", protocol.MaxTextChars)
	if err := cron.Deliver("d-max", "mobile:tel-1", max, nil); err != nil {
		t.Fatal(err)
	}
	text, frames := dlvMessage(t, dev)
	if text != max {
		t.Fatalf("device got %d characters, want the %d delivered", len([]rune(text)), protocol.MaxTextChars)
	}
	if len(frames) < 2 {
		t.Fatalf("12000 characters came in %d frame(s); chunks hold at most %d", len(frames), protocol.DefaultChunkLimit)
	}
	for _, f := range frames {
		if len([]rune(f.Str("text"))) > protocol.DefaultChunkLimit || f.Str("id") != frames[0].Str("id") {
			t.Fatalf("bad chunk: %d characters, id %q (first %q)", len([]rune(f.Str("text"))), f.Str("id"), frames[0].Str("id"))
		}
	}
	dlvOK(t, cron)
}

func TestDeliverToOfflineDevice(t *testing.T) {
	n := startNode(t, nil)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvCron(t, n)
	if err := cron.Deliver("d1", "mobile:tel-nobody", "anyone?", nil); err != nil {
		t.Fatal(err)
	}
	dlvError(t, cron, protocol.CodeDeviceOffline)
	// Not fatal: the same connection delivers to an online device next.
	if err := cron.Deliver("d2", "mobile:tel-1", "still here", nil); err != nil {
		t.Fatal(err)
	}
	dlvExpectText(t, dev, "still here")
	dlvOK(t, cron)
}

func TestDeliverToDisconnectedDevice(t *testing.T) {
	for _, tc := range []struct {
		name       string
		disconnect func(*client.Conn) error
	}{
		{"network drop", (*client.Conn).CloseNow},
		{"close handshake", (*client.Conn).Close},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, nil)
			dev, _ := n.connect(t, "tel-1")
			cron := dlvCron(t, n)
			if err := cron.Deliver("d1", "mobile:tel-1", "while online", nil); err != nil {
				t.Fatal(err)
			}
			dlvExpectText(t, dev, "while online")
			dlvOK(t, cron)

			before := n.Edge.Conns()
			if err := tc.disconnect(dev); err != nil {
				t.Fatalf("disconnect: %v", err)
			}
			// Wait until the edge has let go of the socket. A connection
			// that never goes away is a leak (and a device that looks
			// online): report it, then check the delivery all the same.
			if !dlvWaitConns(n, before-1) {
				t.Errorf("after the device's %s the edge still holds %d connections, want %d: the connection was never torn down",
					tc.name, n.Edge.Conns(), before-1)
			}
			if err := cron.Deliver("d2", "mobile:tel-1", "after leaving", nil); err != nil {
				t.Fatal(err)
			}
			dlvError(t, cron, protocol.CodeDeviceOffline)
		})
	}
}

// dlvWaitConns waits (up to 5 s) until the edge holds want connections: the
// server has seen a disconnect. It polls a counter, not a clock.
func dlvWaitConns(n *node, want int) bool {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for n.Edge.Conns() != want {
		select {
		case <-tick.C:
		case <-deadline:
			return false
		}
	}
	return true
}

// Permissions. In these nodes every connection from 127.0.0.0/8 is a
// trusted reverse proxy, so the forwarding headers name the client.

func dlvProxyNode(t *testing.T) *node {
	return startNode(t, func(c *gateway.Config) {
		c.Edge.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		c.Edge.Auth.DeliverTokens = []secret.Secret{dlvToken}
	})
}

// dlvRefused checks that c may not deliver: forbidden, not fatal, and nothing
// reaches dev (proved with a marker sent by a deliver-token service).
func dlvRefused(t *testing.T, n *node, c, dev *client.Conn) {
	t.Helper()
	if err := c.Deliver("d-refused", "mobile:tel-1", "refused", nil); err != nil {
		t.Fatal(err)
	}
	dlvError(t, c, protocol.CodeForbidden)
	svc := dlvService(t, n, dlvXFF("198.51.100.7"), dlvToken, "svc-marker")
	dlvNothingBefore(t, dev, svc, "mobile:tel-1")
}

// dlvAllowed checks that c's deliver reaches dev.
func dlvAllowed(t *testing.T, c, dev *client.Conn, text string) {
	t.Helper()
	if err := c.Deliver("d-"+text, "mobile:tel-1", text, nil); err != nil {
		t.Fatal(err)
	}
	dlvOK(t, c) // no error (forbidden) came back
	dlvExpectText(t, dev, text)
}

func TestDeliverForbiddenFromRemoteClient(t *testing.T) {
	n := dlvProxyNode(t)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvService(t, n, dlvXFF("203.0.113.9"), testToken, "cron")
	dlvRefused(t, n, cron, dev)
	// Refusing is not the end of it: it stays refused, and still non-fatal.
	dlvRefused(t, n, cron, dev)
}

func TestDeliverAllowedWithDeliverToken(t *testing.T) {
	n := dlvProxyNode(t)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvService(t, n, dlvXFF("203.0.113.9"), dlvToken, "cron")
	dlvAllowed(t, cron, dev, "with a deliver token")
}

func TestDeliverForbiddenThroughLocalProxyWithoutHeader(t *testing.T) {
	n := dlvProxyNode(t)
	dev, _ := n.connect(t, "tel-1") // itself a header-less proxied connection
	cron := dlvService(t, n, client.Options{}, testToken, "cron")
	dlvRefused(t, n, cron, dev)
}

func TestDeliverForbiddenWithForwardedHeader(t *testing.T) {
	n := dlvProxyNode(t)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvService(t, n, client.Options{Header: http.Header{"Forwarded": {`for="203.0.113.9"`}}}, testToken, "cron")
	dlvRefused(t, n, cron, dev)
}

func TestDeliverForbiddenWithSpoofedLoopbackHop(t *testing.T) {
	// The client prepends 127.0.0.1 itself; the proxy appends the real
	// address. The rightmost untrusted hop is the client.
	n := dlvProxyNode(t)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvService(t, n, dlvXFF("127.0.0.1, 203.0.113.9"), testToken, "cron")
	dlvRefused(t, n, cron, dev)
}

func TestDeliverAllowedForLoopbackBehindProxy(t *testing.T) {
	// The proxy says the client is IPv6 loopback, which is not itself one of
	// the trusted proxies (127.0.0.0/8): the client is loopback.
	n := dlvProxyNode(t)
	dev, _ := n.connect(t, "tel-1")
	cron := dlvService(t, n, dlvXFF("::1"), testToken, "cron")
	dlvAllowed(t, cron, dev, "xff ipv6 loopback")

	// With MOBILE_FORWARDED_HEADER=forwarded, the same through Forwarded.
	nf := startNode(t, func(c *gateway.Config) {
		c.Edge.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		c.Edge.Auth.ForwardedHeader = edge.HeaderForwarded
	})
	devf, _ := nf.connect(t, "tel-1")
	cronFwd := dlvService(t, nf, client.Options{Header: http.Header{"Forwarded": {`for="[::1]:5000";proto=https`}}}, testToken, "cron-fwd")
	dlvAllowed(t, cronFwd, devf, "forwarded ipv6 loopback")
}

// TestDeliverOnlyTheNamedForwardingHeader: behind a proxy that writes
// Forwarded (MOBILE_FORWARDED_HEADER=forwarded), an X-Forwarded-For the
// client set itself is ignored: a client at 203.0.113.5 claiming 127.0.0.2
// may not deliver. It used to, because X-Forwarded-For was read first. And
// with the default, X-Forwarded-For, a Forwarded header is ignored.
func TestDeliverOnlyTheNamedForwardingHeader(t *testing.T) {
	n := startNode(t, func(c *gateway.Config) {
		c.Edge.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
		c.Edge.Auth.ForwardedHeader = edge.HeaderForwarded
	})
	dev, _ := n.connect(t, "tel-1")
	spoof := dlvService(t, n, client.Options{Header: http.Header{
		"X-Forwarded-For": {"127.0.0.2"},
		"Forwarded":       {"for=203.0.113.5"},
	}}, testToken, "cron")
	if err := spoof.Deliver("d-spoof", "mobile:tel-1", "refused", nil); err != nil {
		t.Fatal(err)
	}
	dlvError(t, spoof, protocol.CodeForbidden)
	local := dlvService(t, n, client.Options{Header: http.Header{
		"X-Forwarded-For": {"203.0.113.5"},
		"Forwarded":       {"for=127.0.0.2"},
	}}, testToken, "cron-local")
	dlvAllowed(t, local, dev, "named header only")

	nx := dlvProxyNode(t) // the default: X-Forwarded-For
	devx, _ := nx.connect(t, "tel-1")
	spoofx := dlvService(t, nx, client.Options{Header: http.Header{
		"X-Forwarded-For": {"203.0.113.5"},
		"Forwarded":       {"for=\"[::1]\""},
	}}, testToken, "cron")
	dlvRefused(t, nx, spoofx, devx)
}

// TestForwardingHeaderFromUntrustedLoopbackWarnsOnce: with no trusted
// proxies, forwarding headers from a loopback peer (a proxy on the same
// host nobody named) log one warning per process, not one per connection;
// a connection without them logs none.
func TestForwardingHeaderFromUntrustedLoopbackWarnsOnce(t *testing.T) {
	var logs testsvc.Buffer
	g, err := gateway.Start(context.Background(), gateway.Config{
		Listen: "127.0.0.1:0", Router: true, Agent: agent.Demo{},
		Edge: edge.Config{Auth: edge.AuthConfig{Token: testToken}},
	}, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	n := &node{Gateway: g}
	const warning = "not a trusted proxy"
	n.connect(t, "tel-plain")
	if strings.Contains(logs.String(), warning) {
		t.Fatalf("a connection without forwarding headers was warned about:\n%s", logs.String())
	}
	dlvService(t, n, dlvXFF("203.0.113.9"), testToken, "cron-1")
	dlvService(t, n, client.Options{Header: http.Header{"Forwarded": {"for=203.0.113.9"}}}, testToken, "cron-2")
	if got := strings.Count(logs.String(), warning); got != 1 {
		t.Fatalf("%d warnings about forwarding headers from an untrusted loopback peer, want 1:\n%s", got, logs.String())
	}
}

func TestDeliverAllowedForXFFLoopbackThroughProxy(t *testing.T) {
	// Only 127.0.0.2 is a proxy. It forwards a client at 127.0.0.1: loopback.
	n := startNode(t, func(c *gateway.Config) {
		c.Edge.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}
	})
	dev, _ := n.connect(t, "tel-1")
	cron := dlvDialFrom(t, n, "127.0.0.2", http.Header{"X-Forwarded-For": {"127.0.0.1"}}, "cron")
	dlvAllowed(t, cron, dev, "xff 127.0.0.1")
	// The same proxy forwarding a remote client is refused.
	remote := dlvDialFrom(t, n, "127.0.0.2", http.Header{"X-Forwarded-For": {"203.0.113.9"}}, "cron-remote")
	if err := remote.Deliver("d-remote", "mobile:tel-1", "refused", nil); err != nil {
		t.Fatal(err)
	}
	dlvError(t, remote, protocol.CodeForbidden)
	dlvNothingBefore(t, dev, cron, "mobile:tel-1")
}

// dlvDialFrom connects from the loopback address local with header and says
// hello as device with the test token; it skips the test where such an
// address cannot be bound.
func dlvDialFrom(t *testing.T, n *node, local string, header http.Header, device string) *client.Conn {
	t.Helper()
	c, err := client.Dial(testCtx(t), n.URL(), client.Options{LocalAddr: netip.MustParseAddr(local), Header: header, Timeout: 5 * time.Second})
	if err != nil {
		t.Skipf("cannot dial from %s here: %v", local, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	if _, err := c.Hello(testCtx(t), testToken, protocol.Device{ID: device}, protocol.User{}); err != nil {
		t.Fatalf("hello as %q: %v", device, err)
	}
	return c
}

func TestDeliverHeadersIgnoredWithoutTrustedProxies(t *testing.T) {
	n := startNode(t, nil) // TrustedProxies empty
	dev, _ := n.connect(t, "tel-1")
	cron := dlvService(t, n, client.Options{Header: http.Header{
		"X-Forwarded-For": {"203.0.113.9"},
		"Forwarded":       {`for="203.0.113.9"`},
	}}, testToken, "cron")
	dlvAllowed(t, cron, dev, "peer is loopback")
}

func TestDeliverHeadersIgnoredFromUntrustedPeer(t *testing.T) {
	// Only 127.0.0.1 is a proxy; a connection from 127.0.0.2 is not, so its
	// X-Forwarded-For is ignored and its own (loopback) address counts.
	n := startNode(t, func(c *gateway.Config) {
		c.Edge.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	dev, _ := n.connect(t, "tel-1")
	c := dlvDialFrom(t, n, "127.0.0.2", http.Header{"X-Forwarded-For": {"203.0.113.9"}}, "cron")
	dlvAllowed(t, c, dev, "untrusted peer headers ignored")
}

func TestDeliverForbiddenForRemoteDevice(t *testing.T) {
	n := dlvProxyNode(t)
	target, _ := n.connect(t, "tel-1")
	phone := dlvService(t, n, dlvXFF("203.0.113.50"), testToken, "tel-2")
	if err := phone.Deliver("d1", "mobile:tel-1", "spam from a phone", nil); err != nil {
		t.Fatal(err)
	}
	dlvError(t, phone, protocol.CodeForbidden)
	// Also with an empty target (the home device path) and with media.
	if err := phone.Deliver("d2", "", "spam", &client.DeliverMedia{Kind: "image", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	dlvError(t, phone, protocol.CodeForbidden)
	svc := dlvService(t, n, dlvXFF("198.51.100.7"), dlvToken, "svc-marker")
	dlvNothingBefore(t, target, svc, "mobile:tel-1")

	// Its own session still works: a text reaches the agent and is answered.
	if err := phone.Text("m-1", "my own message"); err != nil {
		t.Fatal(err)
	}
	if reply, _ := dlvMessage(t, phone); !strings.Contains(reply, "my own message") {
		t.Fatalf("reply %q does not echo the text", reply)
	}
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "m-1" })
	if ev.Device != "tel-2" {
		t.Fatalf("agent got the text from %q, want tel-2", ev.Device)
	}
}

// TestDeliverForbiddenBeforeValidation: a connection without the right gets
// forbidden for any deliver frame, even a malformed one ("everyone else gets
// forbidden"), so its errors say nothing about what a valid frame would be.
func TestDeliverForbiddenBeforeValidation(t *testing.T) {
	n := dlvProxyNode(t)
	remote := dlvService(t, n, dlvXFF("203.0.113.9"), testToken, "remote")
	for _, raw := range []string{
		`{"t":"deliver","target":"tel-1"}`,                                          // no text or media
		`{"t":"deliver","target":"tel-1","text":5}`,                                 // wrong type
		`{"t":"deliver","target":"tel-1","media":{"kind":"sticker","data":"aGk="}}`, // bad kind
	} {
		if err := remote.SendRaw([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		dlvError(t, remote, protocol.CodeForbidden)
	}
	// A sender with the right gets the validation error for the same frame.
	cron := dlvService(t, n, dlvXFF("203.0.113.9"), dlvToken, "cron")
	if err := cron.SendRaw([]byte(`{"t":"deliver","target":"tel-1","text":5}`)); err != nil {
		t.Fatal(err)
	}
	dlvError(t, cron, protocol.CodeBadFrame)
}

// TestDeliverTargetBound: on a node on the real NATS, a deliver target of
// exactly 120 characters (the longest device id) is delivered; 121 and
// 5,000 characters are answered bad_frame without reaching the bus, and the
// edge keeps serving its phones (a 5,000-character target used to become a
// subject the NATS server closed the connection over, for good).
func TestDeliverTargetBound(t *testing.T) {
	prefix := randomPrefix()
	n := startClusterNode(t, prefix, true)
	long := "tel-" + prefix[13:25] + "-"
	long += strings.Repeat("é", protocol.MaxDeviceFieldChars-len([]rune(long)))
	dev, _ := n.connect(t, long)
	cron, _ := n.connect(t, "cron-"+prefix[13:25])
	if err := cron.Deliver("d-at", "mobile:"+long, "at the bound", nil); err != nil {
		t.Fatal(err)
	}
	dlvExpectText(t, dev, "at the bound")
	for _, target := range []string{long + "x", strings.Repeat("x", 5000)} {
		if err := cron.Deliver("d-over", "mobile:"+target, "too long", nil); err != nil {
			t.Fatal(err)
		}
		dlvError(t, cron, protocol.CodeBadFrame)
	}
	other, _ := n.connect(t, "tel2-"+prefix[13:25])
	if err := other.Text("m-1", "still served"); err != nil {
		t.Fatal(err)
	}
	msg, err := other.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil {
		t.Fatal(err)
	}
	if text, _, err := other.CollectMessage(testCtx(t), msg.Str("id")); err != nil || !strings.Contains(text, "still served") {
		t.Fatalf("reply after the refused delivers: %q, %v", text, err)
	}
	if err := cron.Deliver("d-after", "mobile:"+long, "after", nil); err != nil {
		t.Fatal(err)
	}
	dlvExpectText(t, dev, "after")
}
