package gateway_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

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
	deadline := time.Now().Add(10 * time.Second)
	for {
		extra := runtime.NumGoroutine() - g0
		if extra < conns/4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle sockets hold %d more goroutines; want fewer than %d", conns, extra, conns/4)
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond)
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
