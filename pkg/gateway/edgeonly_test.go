package gateway_test

import (
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestEdgeOnlyNodeKeepsWithoutARouter: a node without a router (an edge of
// a cluster, MOBILE_ROUTER=off) builds no Router, yet keeps cron's deliver
// frame with a ttl for a phone that is away, through the process's one
// Outbox, as the router's API would: delivered, queued, and in the
// device's outbox.
func TestEdgeOnlyNodeKeepsWithoutARouter(t *testing.T) {
	n := startNode(t, func(cfg *gateway.Config) { cfg.Router = false })
	if n.Router != nil || n.API != nil {
		t.Fatalf("an edge-only node built a router (%v) or its API (%v)", n.Router, n.API)
	}
	if n.Outbox == nil {
		t.Fatal("an edge-only node has no outbox")
	}
	cron, _ := n.connect(t, "cron")
	if err := cron.Send(map[string]any{"t": "deliver", "id": "job-1", "target": "mobile:tel-away", "text": "kept by the edge", "ttl": 3600}); err != nil {
		t.Fatal(err)
	}
	f, err := cron.Expect(testCtx(t), protocol.TypeDelivered)
	if err != nil || !f.Bool("queued") {
		t.Fatalf("deliver with a ttl to a phone that is away: %v, %v; want delivered, queued", f, err)
	}
	items, err := n.Store.PeekOutbox(testCtx(t), "tel-away", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 || !strings.Contains(string(items[0].Data), "kept by the edge") {
		t.Fatalf("the away phone's outbox holds %d items (%+v), want the delivery", len(items), items)
	}
}
