package gateway_test

import (
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// BenchmarkIdleConnectionMemory measures what one idle phone costs the
// node: heap and goroutine stacks after N connections said hello and went
// quiet, divided by N. The phones are bare sockets (no reader goroutine, no
// buffers), so nearly all of the difference is the server's. Run:
//
//	go test -run '^$' -bench IdleConnectionMemory -benchtime 1x ./pkg/gateway
func BenchmarkIdleConnectionMemory(b *testing.B) {
	const conns = 5000
	n := startNode(b, nil)
	addr := n.Addr().String()
	hello := func(i int) []byte {
		return fmt.Appendf(nil, `{"t":"hello","token":%q,"device":{"id":"idle-%d"}}`, testToken, i)
	}
	measure := func() (heap, stack uint64, goroutines int) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse, ms.StackInuse, runtime.NumGoroutine()
	}
	ctx := testCtx(b) // one context for every dial: one per dial would be counted as the server's
	for range b.N {
		heap0, stack0, g0 := measure()
		socks := make([]net.Conn, 0, conns)
		for i := range conns {
			c, _, _, err := ws.Dial(ctx, "ws://"+addr+"/ws")
			if err != nil {
				b.Fatalf("dial %d: %v", i, err)
			}
			socks = append(socks, c)
			if err := wsutil.WriteClientText(c, hello(i)); err != nil {
				b.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := wsutil.ReadServerText(c); err != nil {
				b.Fatalf("ready %d: %v", i, err)
			}
		}
		time.Sleep(200 * time.Millisecond) // let handshake goroutines end
		heap1, stack1, g1 := measure()
		perConn := float64(heap1+stack1-heap0-stack0) / conns
		b.ReportMetric(perConn, "B/idle-conn")
		b.ReportMetric(float64(g1-g0)/conns, "goroutines/idle-conn")
		b.Logf("%d idle connections: heap +%d KiB, stacks +%d KiB, goroutines +%d: %.0f B per connection",
			conns, (heap1-heap0)>>10, (stack1-stack0)>>10, g1-g0, perConn)
		for _, c := range socks {
			c.Close()
		}
	}
}
