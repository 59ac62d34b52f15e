package gateway_test

// The metrics of a connection's life: how it ended (close code and who
// began it), how long it lasted, a drain, a slow reader cut off and a
// connection that could not be taken. Real sockets on loopback; the phones
// here are raw WebSocket clients so that they can close with any code, or
// without a close frame.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"golang.org/x/sys/unix"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// metricsNode starts a node recording into a Telemetry of its own and
// returns it with the URL of its /metrics.
func metricsNode(t *testing.T, mutate func(*gateway.Config)) (*node, string, *telemetry.Telemetry) {
	t.Helper()
	tel := newTelemetry(t, telemetry.Config{ServiceName: "hermes-edge"})
	n := startNode(t, func(c *gateway.Config) {
		c.Telemetry = tel
		if mutate != nil {
			mutate(c)
		}
	})
	srv := httptest.NewServer(tel.Handler())
	t.Cleanup(srv.Close)
	return n, srv.URL + "/metrics", tel
}

// rawPhone opens a WebSocket to n with gobwas/ws, says hello as device
// and waits for ready.
func rawPhone(t *testing.T, n *node, device string) net.Conn {
	t.Helper()
	nc, _, _, err := ws.Dialer{}.Dial(testCtx(t), n.URL())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	hello, _ := json.Marshal(map[string]any{"t": "hello", "token": testToken,
		"device": map[string]any{"id": device, "name": "Raw", "platform": "android", "app_version": "1.0.0"}})
	if err := wsutil.WriteClientText(nc, hello); err != nil {
		t.Fatalf("hello: %v", err)
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		b, err := wsutil.ReadServerText(nc)
		if err != nil {
			t.Fatalf("waiting for ready: %v", err)
		}
		if strings.Contains(string(b), `"t":"ready"`) {
			return nc
		}
	}
}

// sendClose sends a close frame with body (nil: an empty one).
func sendClose(t *testing.T, nc net.Conn, body []byte) {
	t.Helper()
	if err := ws.WriteFrame(nc, ws.MaskFrame(ws.NewCloseFrame(body))); err != nil {
		t.Fatalf("close frame: %v", err)
	}
}

// awaitClose reads until the edge's close frame and returns its code; the
// socket then closes.
func awaitClose(t *testing.T, nc net.Conn) ws.StatusCode {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer nc.Close()
	for {
		h, err := ws.ReadHeader(nc)
		if err != nil {
			t.Fatalf("waiting for the edge's close frame: %v", err)
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(nc, p); err != nil {
			t.Fatalf("reading a frame: %v", err)
		}
		if h.OpCode == ws.OpClose {
			code, _ := ws.ParseCloseFrameData(p)
			sendClose(t, nc, p) // complete the closing handshake
			return code
		}
	}
}

func closes(code, by string) string {
	return `hermes_closes_total{by="` + by + `",code="` + code + `"}`
}

// TestCloseCodesAndDurations: every way a connection ends is counted once,
// under the code of the close frame that began the closing (1005 for one
// without a code, 1006 when there was none) and the side that began it;
// each closed connection is one observation of its duration. A drain
// shows in hermes_draining until the edge is closed.
func TestCloseCodesAndDurations(t *testing.T) {
	n, url, _ := metricsNode(t, nil)
	fresh := testsvc.Scrape(t, url)
	for _, s := range []string{closes("1000", "peer"), closes("1006", "edge"), closes("other", "peer"),
		`hermes_slow_reader_closes_total{reason="queue_full"}`, `hermes_accept_failures_total{stage="upgrade"}`, "hermes_draining"} {
		if v, ok := fresh[s]; !ok || v != 0 {
			t.Errorf("fresh node: %s = %v (present %v), want 0", s, v, ok)
		}
	}

	sendClose(t, rawPhone(t, n, "tel-close-1000"), ws.NewCloseFrameBody(ws.StatusNormalClosure, "bye"))
	sendClose(t, rawPhone(t, n, "tel-close-4001"), ws.NewCloseFrameBody(4001, "app-defined"))
	sendClose(t, rawPhone(t, n, "tel-close-empty"), nil)
	rawPhone(t, n, "tel-close-drop").Close() // no close frame: the TCP connection ends
	// A refused hello: the edge closes with 1008.
	bad := n.dial(t)
	if _, err := bad.Hello(testCtx(t), "wrong-token", protocol.Device{ID: "tel-close-bad"}, protocol.User{}); err == nil {
		t.Fatal("a wrong token was accepted")
	}
	// A second socket of a device replaces the first: 1000 from the edge.
	old := rawPhone(t, n, "tel-close-twice")
	rawPhone(t, n, "tel-close-twice")
	if code := awaitClose(t, old); code != ws.StatusNormalClosure {
		t.Fatalf("the replaced socket got close %d, want 1000", code)
	}
	testsvc.WaitMetric(t, 10*time.Second, url, "hermes_connections", testsvc.Equals(1))
	m := testsvc.WaitMetric(t, 10*time.Second, url, "hermes_connection_duration_seconds_count", testsvc.AtLeast(6))
	for s, want := range map[string]float64{
		closes("1000", "peer"):                     1,
		closes("other", "peer"):                    1, // 4001 is no code the edge knows
		closes("1005", "peer"):                     1,
		closes("1006", "peer"):                     1,
		closes("1008", "edge"):                     1,
		closes("1000", "edge"):                     1,
		closes("1001", "edge"):                     0,
		closes("1006", "edge"):                     0,
		"hermes_connection_duration_seconds_count": 6,
		"hermes_draining":                          0,
	} {
		if m[s] != want {
			t.Errorf("%s = %v, want %v", s, m[s], want)
		}
	}
	if m[`hermes_connection_duration_seconds_bucket{le="1"}`] != 6 {
		t.Errorf("connections of under a second are not in the le=1 bucket: %v", m[`hermes_connection_duration_seconds_bucket{le="1"}`])
	}

	// A drain: the last phone is closed with 1001, and the edge reports
	// draining until it is closed.
	last := rawPhone(t, n, "tel-close-drain")
	got := make(chan ws.StatusCode, 1)
	go func() { got <- awaitClose(t, last) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Edge.Drain(ctx, 100*time.Millisecond); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if code := <-got; code != ws.StatusGoingAway {
		t.Errorf("the drain closed with %d, want 1001", code)
	}
	m = testsvc.Scrape(t, url)
	if m["hermes_draining"] != 1 || m[closes("1001", "edge")] != 2 { // the device's second socket and the last phone
		t.Errorf("after the drain: hermes_draining = %v, closes 1001 by edge = %v; want 1 and 2", m["hermes_draining"], m[closes("1001", "edge")])
	}
	if err := n.Edge.Close(); err != nil {
		t.Fatal(err)
	}
	if v := testsvc.Scrape(t, url)["hermes_draining"]; v != 0 {
		t.Errorf("a closed edge still reports hermes_draining %v", v)
	}
}

// TestSlowReaderCloses: a phone that stops reading is cut either when its
// outbound queue passes MaxOutboundBytes or when a write makes no progress
// for WriteTimeout; each is counted under its reason, and as a close
// without a close frame that the edge began.
func TestSlowReaderCloses(t *testing.T) {
	t.Parallel() // waits on a slow or stalled reader, not on the CPU
	for _, tc := range []struct {
		reason string
		mutate func(*gateway.Config)
	}{
		{"queue_full", func(c *gateway.Config) {
			c.Edge.MaxOutboundBytes = 1 << 20
			c.Edge.WriteTimeout = time.Minute
		}},
		{"write_stalled", func(c *gateway.Config) { c.Edge.WriteTimeout = time.Second }},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			n, url, _ := metricsNode(t, tc.mutate)
			nc, _ := srDial(t, n, "tel-slow-"+tc.reason)
			// The echo of an 8 MiB file, which the phone never reads.
			if err := wsutil.WriteClientText(nc, mdRaw(map[string]any{"t": "media", "id": "slow-metrics", "kind": "document",
				"mime": "application/octet-stream", "filename": "big.bin"}, mdBytes(mdMax, 3))); err != nil {
				t.Fatalf("upload: %v", err)
			}
			m := testsvc.WaitMetric(t, 10*time.Second, url, `hermes_slow_reader_closes_total{reason="`+tc.reason+`"}`, testsvc.AtLeast(1))
			for s, want := range map[string]float64{
				`hermes_slow_reader_closes_total{reason="queue_full"}`:    0,
				`hermes_slow_reader_closes_total{reason="write_stalled"}`: 0,
				closes("1006", "edge"): 1,
				closes("1006", "peer"): 0,
			} {
				if strings.Contains(s, tc.reason) {
					want = 1
				}
				if m[s] != want {
					t.Errorf("%s = %v, want %v", s, m[s], want)
				}
			}
		})
	}
}

// TestUpgradeFailures: requests on the WebSocket port that are no
// WebSocket upgrade of /ws are counted; a connection that sends nothing
// and closes (a load balancer's TCP check) is not.
func TestUpgradeFailures(t *testing.T) {
	n, url, _ := metricsNode(t, nil)
	roundTrip := func(request string) string {
		t.Helper()
		c, err := net.Dial("tcp", n.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		answer, err := io.ReadAll(c) // until the edge closes it
		if err != nil {
			t.Fatalf("reading the answer to %q: %v", request, err)
		}
		return string(answer)
	}
	if answer := roundTrip(""); answer != "" {
		t.Fatalf("a connection that sent nothing got %q", answer)
	}
	if v := testsvc.Scrape(t, url)[`hermes_accept_failures_total{stage="upgrade"}`]; v != 0 {
		t.Fatalf("a bare TCP check counted as a failed upgrade: %v", v)
	}
	for _, req := range []string{
		"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n", // no Upgrade headers
		"GET /elsewhere HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
	} {
		if answer := roundTrip(req); !strings.HasPrefix(answer, "HTTP/1.1 4") {
			t.Errorf("%q was answered %q, want a 4xx", req, answer)
		}
	}
	m := testsvc.Scrape(t, url)
	if m[`hermes_accept_failures_total{stage="upgrade"}`] != 2 || m[`hermes_accept_failures_total{stage="accept"}`] != 0 {
		t.Errorf("accept failures: upgrade %v, accept %v; want 2 and 0",
			m[`hermes_accept_failures_total{stage="upgrade"}`], m[`hermes_accept_failures_total{stage="accept"}`])
	}
}

// TestAcceptFailure: when the process is out of file descriptors the
// listener's Accept fails; the edge counts it, waits and takes the
// connection once descriptors are free again. The phone's socket is made
// before every descriptor is taken, and connects after. The limit is the
// whole test binary's, so this test does not run in parallel with others,
// and /metrics is read only once the limit is back.
func TestAcceptFailure(t *testing.T) {
	logs := newSignalWriter("accept failed")
	tel := newTelemetry(t, telemetry.Config{ServiceName: "hermes-edge"})
	g, err := gateway.Start(context.Background(), gateway.Config{Listen: "127.0.0.1:0", Router: true, Telemetry: tel,
		Edge: edge.Config{Auth: edge.AuthConfig{Token: testToken}}}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	sock, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(sock), "phone")
	defer f.Close()

	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	var fillers []*os.File
	restore := func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Errorf("restoring the open-files limit: %v", err)
		}
		for _, f := range fillers {
			f.Close()
		}
		fillers = nil
	}
	t.Cleanup(restore)
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	highest := 0
	for _, fd := range fds {
		var n int
		if _, err := fmt.Sscan(fd.Name(), &n); err == nil {
			highest = max(highest, n)
		}
	}
	// No descriptor above the highest in use, and the free ones below it
	// taken.
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(highest + 1), Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				restore()
				t.Fatalf("filling the descriptor table: %v", err)
			}
			break
		}
		fillers = append(fillers, f)
	}
	addr := g.Addr().(*net.TCPAddr)
	sa := &unix.SockaddrInet4{Port: addr.Port}
	copy(sa.Addr[:], addr.IP.To4())
	if err := unix.Connect(sock, sa); err != nil { // the kernel's backlog takes it
		restore()
		t.Fatalf("connect: %v", err)
	}
	select {
	case <-logs.seen:
	case <-time.After(10 * time.Second):
		restore()
		t.Fatal("the edge's Accept did not fail with the descriptors used up")
	}
	restore()

	nc, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := (ws.Dialer{}).Upgrade(nc, &url.URL{Scheme: "ws", Host: addr.String(), Path: "/ws"}); err != nil {
		t.Fatalf("the connection was not taken once descriptors were free: %v", err)
	}

	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !regexp.MustCompile(`(?m)^hermes_accept_failures_total\{stage="accept"\} [1-9]`).MatchString(rec.Body.String()) {
		t.Errorf("the failed Accept was not counted:\n%s", grepLines(rec.Body.String(), "hermes_accept_failures"))
	}
}

// signalWriter closes seen once what is written to it contains needle.
type signalWriter struct {
	needle string
	mu     sync.Mutex
	buf    strings.Builder
	seen   chan struct{}
	once   sync.Once
}

func newSignalWriter(needle string) *signalWriter {
	return &signalWriter{needle: needle, seen: make(chan struct{})}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	found := strings.Contains(w.buf.String(), w.needle)
	w.mu.Unlock()
	if found {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
