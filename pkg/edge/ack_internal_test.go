package edge

import (
	"fmt"
	"strings"
	"testing"
)

// TestRecentAcksBoundedBySize: a connection remembers at most 64 early
// acks and 8 KiB of their ids. 64 ids of 128 ASCII characters are exactly
// the bound and all kept; one of 128 two-byte characters then forgets the
// two oldest.
func TestRecentAcksBoundedBySize(t *testing.T) {
	c := &conn{}
	c.flags.set(flagAcked) // its acks are recorded already: this conn has no server to record them
	id := func(i int) string { s := fmt.Sprintf("a-%d-", i); return s + strings.Repeat("x", 128-len(s)) }
	for i := range recentAcks {
		c.onAck(id(i))
	}
	size := func() (n int) {
		for _, x := range c.recentAcks {
			n += len(x)
		}
		return n
	}
	if len(c.recentAcks) != recentAcks || size() != recentAckBytes || c.recentAcks[0] != id(0) {
		t.Fatalf("%d acks of %d bytes kept, the first %.10q; want all %d, %d bytes", len(c.recentAcks), size(), c.recentAcks[0], recentAcks, recentAckBytes)
	}
	wide := strings.Repeat("ж", 128)
	c.onAck(wide)
	if len(c.recentAcks) != recentAcks-1 || size() > recentAckBytes || c.recentAcks[0] != id(2) || c.recentAcks[len(c.recentAcks)-1] != wide {
		t.Fatalf("after a 256-byte id: %d acks of %d bytes, the first %.10q; want %d, the oldest two forgotten", len(c.recentAcks), size(), c.recentAcks[0], recentAcks-1)
	}
	c.mu.Lock()
	acked := c.ackedLocked(wide)
	c.mu.Unlock()
	if !acked {
		t.Fatal("the newest early ack was not remembered")
	}
}
