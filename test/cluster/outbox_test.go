//go:build unix

package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
)

// TestEdgeKilledMidFlush: edge A dies by SIGKILL while it writes a phone's
// large outbox (larger than a loopback connection's socket buffers, so the
// flush cannot be complete). The items are still in the outbox; the phone
// reconnects to edge B and gets every one of them, in order.
func TestEdgeKilledMidFlush(t *testing.T) {
	t.Parallel()
	const items, size = 250, 90_000 // 22 MB; the API takes texts up to 100,000 characters
	c := newCluster(t, options{})
	dev := newDevice("tel-big")
	text := func(i int) string { return fmt.Sprintf("%03d:", i) + strings.Repeat(string(rune('a'+i%26)), size) }
	for i := range items {
		c.say(t, dev, agentMessage{ID: fmt.Sprintf("big-%03d", i), Text: text(i), Final: true})
	}
	wantOutboxLen(t, c, dev, items)

	// A client that keeps few frames for its consumer stops reading soon.
	conn, err := client.Dial(testCtx(t), c.edge("A").url, client.Options{Timeout: 5 * time.Second, Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if _, err := conn.Hello(testCtx(t), c.token, device(dev), user); err != nil {
		t.Fatal(err)
	}
	readUntil(t, conn, "the first outbox frame", func(f client.Frame) bool { return f.T() == protocol.TypeMessage })
	c.edge("A").Kill(t)
	wantOutboxLen(t, c, dev, items)

	onB := c.hello(t, "B", dev)
	ctx := within(t, 60*time.Second)
	for i := range items {
		id := fmt.Sprintf("big-%03d", i)
		got, _, err := onB.CollectMessage(ctx, id)
		if err != nil {
			t.Fatalf("on B, item %d: %v", i, err)
		}
		if got != text(i) {
			t.Fatalf("on B, item %d has %d bytes, want %d", i, len(got), len(text(i)))
		}
	}
	testsvc.WaitFor(t, 15*time.Second, "the outbox acknowledged by B", func() bool { return outboxLen(t, c, dev) == 0 })
}

// outboxLen is the number of items in dev's outbox in Redis.
func outboxLen(t *testing.T, c *cluster, dev string) int64 {
	t.Helper()
	rdb, err := redisstore.NewClient(c.redisMode, c.redis, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	n, err := rdb.LLen(context.Background(), c.prefix+"outbox:{"+dev+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func wantOutboxLen(t *testing.T, c *cluster, dev string, want int64) {
	t.Helper()
	if n := outboxLen(t, c, dev); n != want {
		t.Fatalf("the outbox of %s holds %d items, want %d", dev, n, want)
	}
}
