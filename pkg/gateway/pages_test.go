package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/web"
)

// TestPagesKeepIdleSocketsOffGoroutines: with the pages served on the
// WebSocket's address, an idle phone still costs no goroutine (its socket
// is registered with epoll, not read by a goroutine of its own), and the
// pages answer next to /ws.
func TestPagesKeepIdleSocketsOffGoroutines(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("epoll is Linux's")
	}
	const conns = 200
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Edge.Pages = web.Handler(web.Options{Client: true})
		cfg.Edge.AvatarPath = web.AvatarPath
	})
	addr := n.Addr().String()
	resp, err := http.Get("http://" + addr + "/avatar/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "avatar.js") {
		t.Fatalf("GET /avatar/ = %d %q", resp.StatusCode, body)
	}
	http.DefaultClient.CloseIdleConnections()

	g0 := runtime.NumGoroutine()
	socks := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range socks {
			c.Close()
		}
	}()
	for i := range conns {
		c, _, _, err := ws.Dial(testCtx(t), "ws://"+addr+"/ws")
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		socks = append(socks, c)
		if err := wsutil.WriteClientText(c, fmt.Appendf(nil, `{"t":"hello","token":%q,"device":{"id":"pages-idle-%d"}}`, testToken, i)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		msg, err := wsutil.ReadServerText(c)
		if err != nil || !strings.Contains(string(msg), `"t":"ready"`) {
			t.Fatalf("ready %d: %s, %v", i, msg, err)
		}
		if want := `"avatar_url":"http://` + addr + `/avatar/"`; !strings.Contains(string(msg), want) {
			t.Fatalf("ready %s, want %s", msg, want)
		}
	}
	// The handshakes' goroutines end; a goroutine per socket would stay.
	var extra int
	if !testsvc.Eventually(10*time.Second, func() bool {
		runtime.Gosched()
		extra = runtime.NumGoroutine() - g0
		return extra < conns/4
	}) {
		t.Fatalf("%d idle sockets hold %d more goroutines; want fewer than %d", conns, extra, conns/4)
	}
}

// TestAvatarURLBehindProxy: behind a trusted proxy that says the phone came
// over https, ready's avatar_url is https; the same header from anyone else
// is ignored.
func TestAvatarURLBehindProxy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted bool
		scheme  string
	}{{"trusted proxy", true, "https"}, {"untrusted peer", false, "http"}} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, func(cfg *gateway.Config) {
				cfg.Edge.Pages = web.Handler(web.Options{})
				cfg.Edge.AvatarPath = web.AvatarPath
				if tc.trusted {
					cfg.Edge.Auth.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
				}
			})
			addr := n.Addr().String()
			d := ws.Dialer{Header: ws.HandshakeHeaderHTTP(http.Header{"X-Forwarded-Proto": {"https"}})}
			c, _, _, err := d.Dial(testCtx(t), "ws://"+addr+"/ws")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := wsutil.WriteClientText(c, fmt.Appendf(nil, `{"t":"hello","token":%q,"device":{"id":"proxied"}}`, testToken)); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			msg, err := wsutil.ReadServerText(c)
			if err != nil {
				t.Fatal(err)
			}
			if want := `"avatar_url":"` + tc.scheme + `://` + addr + `/avatar/"`; !strings.Contains(string(msg), want) {
				t.Fatalf("ready %s, want %s", msg, want)
			}
		})
	}
}

// TestPagesWithBodyAnnouncedDoNotHoldThePort: 2,100 requests for the
// browser client and the avatar page that announce a body and never send
// it are answered 400 (or 503 while the 1,024 page connections are in use)
// and closed, each within PageTimeout (10 s) of being sent: the pages read
// no body. They were held for as long as the client kept them, until the
// edge ran out of files. A phone connects and round-trips while they come.
func TestPagesWithBodyAnnouncedDoNotHoldThePort(t *testing.T) {
	const requests = 2100
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Edge.Pages = web.Handler(web.Options{Client: true})
		cfg.Edge.AvatarPath = web.AvatarPath
	})
	addr := n.Addr().String()
	timeout := edge.DefaultConfig().PageTimeout
	type sent struct {
		nc net.Conn
		at time.Time
	}
	socks := make([]sent, 0, requests)
	defer func() {
		for _, s := range socks {
			s.nc.Close()
		}
	}()
	for i := range requests {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		path := []string{"/", "/avatar/"}[i%2]
		if _, err := fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n", path, addr); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		socks = append(socks, sent{nc, time.Now()})
		if i == requests/2 {
			phone, _ := n.connect(t, "tel-pages-body")
			mtMarker(t, n, phone, "tel-pages-body")
		}
	}
	phone, _ := n.connect(t, "tel-pages-body-after")
	mtMarker(t, n, phone, "tel-pages-body-after")
	statuses := map[int]int{}
	for i, s := range socks {
		s.nc.SetReadDeadline(s.at.Add(testsvc.Slack(timeout)))
		resp, err := http.ReadResponse(bufio.NewReader(s.nc), nil)
		if err != nil {
			t.Fatalf("request %d: no answer within %v: %v", i, testsvc.Slack(timeout), err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		// The edge closes the connection: nothing more comes.
		if k, err := s.nc.Read(make([]byte, 1)); k != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("request %d: the connection was not closed within %v: %d, %v", i, testsvc.Slack(timeout), k, err)
		}
		statuses[resp.StatusCode]++
	}
	t.Logf("statuses: %v", statuses)
	if statuses[http.StatusBadRequest]+statuses[http.StatusServiceUnavailable] != requests || statuses[http.StatusBadRequest] == 0 {
		t.Fatalf("statuses %v; want %d × 400 or 503", statuses, requests)
	}
	waitFor(t, "the page connections closed", func() bool { return n.Edge.PageConns() == 0 })
}

// TestPageConnsBudget: with MaxPageConns 8 and PageTimeout 2 s, 8 page
// requests whose headers never end are held, the 9th is answered 503 at
// once, a phone still connects and round-trips, and the 8 are closed
// within the timeout; then a page request is answered 200 again.
func TestPageConnsBudget(t *testing.T) {
	const limit, timeout = 8, 2 * time.Second
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Edge.Pages = web.Handler(web.Options{Client: true})
		cfg.Edge.AvatarPath = web.AvatarPath
		cfg.Edge.MaxPageConns = limit
		cfg.Edge.PageTimeout = timeout
	})
	addr := n.Addr().String()
	start := time.Now()
	held := make([]net.Conn, limit)
	for i := range held {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		fmt.Fprintf(nc, "GET / HTTP/1.1\r\nHost: %s\r\n", addr) // the headers never end
		held[i] = nc
	}
	waitFor(t, "the page connections held", func() bool { return n.Edge.PageConns() == limit })
	get := func() *http.Response {
		t.Helper()
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		fmt.Fprintf(nc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
		nc.SetReadDeadline(time.Now().Add(testsvc.Slack(timeout)))
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := get(); resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Fatalf("a page request past the budget: %d %v; want 503 and close", resp.StatusCode, resp.Header)
	}
	phone, _ := n.connect(t, "tel-page-budget")
	mtMarker(t, n, phone, "tel-page-budget")
	for i, nc := range held {
		nc.SetReadDeadline(start.Add(testsvc.Slack(2 * timeout)))
		if _, err := io.Copy(io.Discard, nc); err != nil {
			t.Fatalf("held request %d: not closed within the page timeout: %v", i, err)
		}
	}
	waitFor(t, "the page connections closed", func() bool { return n.Edge.PageConns() == 0 })
	if resp := get(); resp.StatusCode != http.StatusOK {
		t.Fatalf("a page request once the budget is free: %d", resp.StatusCode)
	}
}
