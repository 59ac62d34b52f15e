package gateway_test

import (
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// BenchmarkIdleConnectionMemory measures what one idle phone costs the
// node: heap and goroutine stacks after N connections said hello and went
// quiet, divided by N. The phones are bare sockets (no reader goroutine, no
// buffers), so nearly all of the difference is the server's. "plain" says
// hello with a device id only; "bounds" with every device field and the
// user's name past their bound (as long as fits in the 8 KiB before hello,
// about 1,500 characters each, cut to 120), the user's id at it. Run:
//
//	go test -run '^$' -bench IdleConnectionMemory -benchtime 1x ./pkg/gateway
func BenchmarkIdleConnectionMemory(b *testing.B) {
	const conns = 5000
	for _, hello := range []struct {
		name  string
		hello func(i int) []byte
	}{{"plain", plainHello}, {"bounds", boundsHello}} {
		b.Run(hello.name, func(b *testing.B) {
			n := startNode(b, nil)
			for range b.N {
				perConn, stack, goroutines := idleMemory(b, n, conns, hello.hello)
				b.ReportMetric(perConn, "B/idle-conn")
				b.ReportMetric(goroutines, "goroutines/idle-conn")
				b.Logf("%d idle connections: %.0f B per connection (stacks %.0f), %.2f goroutines each", conns, perConn, stack, goroutines)
			}
		})
	}
}

// TestHelloFieldsHoldOnlyTheirBound: 1,000 phones whose hello carries five
// overlong fields (as long as fits in the 8 KiB before hello; a hello with
// five 12,000-character fields is refused whole as too_big) cost the node
// what phones with those fields at their bound do. Each held
// about 38 KiB while 12,000-character fields were kept whole, and the
// 7.5 KB of these fields would be kept the same way (a plain hello costs
// about 2.6 KiB); the test allows 8 KiB, and a phone connects and round-trips
// while they are held.
func TestHelloFieldsHoldOnlyTheirBound(t *testing.T) {
	const conns = 1000
	n := startNode(t, nil)
	perConn, _, _ := idleMemory(t, n, conns, func(i int) []byte {
		if i == conns-1 {
			c, _ := n.connect(t, "tel-hello-bounds-phone")
			mtMarker(t, n, c, "tel-hello-bounds-phone")
		}
		return boundsHello(i)
	})
	t.Logf("%d phones with five overlong hello fields: %.0f B each", conns, perConn)
	if perConn > 8<<10 {
		t.Fatalf("each phone with overlong hello fields holds %.1f KiB; want under 8 KiB", perConn/1024)
	}
}

func plainHello(i int) []byte {
	return fmt.Appendf(nil, `{"t":"hello","token":%q,"device":{"id":"idle-%d"}}`, testToken, i)
}

// boundsHello is a hello whose device fields and user name are as long as
// five of them fit in edge.MaxPreHelloBytes with the rest of the hello (the
// id is made unique in its first 120) and whose user id is exactly at its
// bound.
func boundsHello(i int) []byte {
	long := strings.Repeat("f", (edge.MaxPreHelloBytes-512)/5)
	id := fmt.Sprintf("bounds-%d-", i)
	b, _ := json.Marshal(map[string]any{"t": "hello", "token": testToken,
		"device": map[string]any{"id": id + long[len(id):], "name": long, "platform": long, "app_version": long},
		"user":   map[string]any{"id": long[:protocol.MaxUserFieldChars], "name": long}})
	return b
}

// idleMemory connects conns bare sockets that say hello(i) and measures
// what each costs the node: heap and stacks, the stacks alone, and
// goroutines, per connection. The sockets close when it returns.
func idleMemory(t testing.TB, n *node, conns int, hello func(i int) []byte) (perConn, stack, goroutines float64) {
	t.Helper()
	addr := n.Addr().String()
	measure := func() (heap, stack uint64, goroutines int) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse, ms.StackInuse, runtime.NumGoroutine()
	}
	ctx := testCtx(t) // one context for every dial: one per dial would be counted as the server's
	heap0, stack0, g0 := measure()
	socks := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range socks {
			c.Close()
		}
	}()
	for i := range conns {
		c, _, _, err := ws.Dial(ctx, "ws://"+addr+"/ws")
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		socks = append(socks, c)
		if err := wsutil.WriteClientText(c, hello(i)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if msg, err := wsutil.ReadServerText(c); err != nil || !strings.Contains(string(msg), `"t":"ready"`) {
			t.Fatalf("ready %d: %.200s, %v", i, msg, err)
		}
	}
	// The handshakes' goroutines end.
	waitFor(t, "the handshakes' goroutines to end", func() bool { return runtime.NumGoroutine()-g0 < conns/4+50 })
	heap1, stack1, g1 := measure()
	return float64(int64(heap1+stack1)-int64(heap0+stack0)) / float64(conns),
		float64(int64(stack1)-int64(stack0)) / float64(conns), float64(g1-g0) / float64(conns)
}
