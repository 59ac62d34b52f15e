package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// clusterURLs returns the external NATS and Redis for in-process cluster
// tests (see internal/testsvc).
func clusterURLs(t *testing.T) (natsURL, redisURL string) {
	t.Helper()
	return testsvc.NATSURL(t), testsvc.RedisURL(t)
}

// startClusterNode starts a node on the shared NATS and Redis under prefix.
func startClusterNode(t *testing.T, prefix string, router bool) *node {
	natsURL, redisURL := clusterURLs(t)
	return startNode(t, func(cfg *gateway.Config) {
		cfg.NATSURL, cfg.RedisURL, cfg.RedisPrefix, cfg.Router = natsURL, redisURL, prefix, router
		cfg.NATSPrefix = strings.NewReplacer(":", ".", "-", "_").Replace(prefix) // own subjects too
	})
}

func randomPrefix() string {
	return "hermes-test:" + testsvc.RandomHex(6) + ":"
}

// TestClusterInProcess: two nodes share NATS and Redis; the router runs on
// the second only. A device on the first talks to the agent through it,
// cron delivers from the second, and a reconnection to the second takes the
// device over from the first.
func TestClusterInProcess(t *testing.T) {
	prefix := randomPrefix()
	a := startClusterNode(t, prefix, false)
	b := startClusterNode(t, prefix, true)
	dev := "tel-" + prefix[13:25]

	c, _ := a.connect(t, dev)
	if err := c.Text("m-1", "across the cluster"); err != nil {
		t.Fatal(err)
	}
	msg, err := c.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil {
		t.Fatal(err)
	}
	text, _, err := c.CollectMessage(testCtx(t), msg.Str("id"))
	if err != nil || !strings.Contains(text, "across the cluster") {
		t.Fatalf("reply %q, %v", text, err)
	}

	cron, _ := b.connect(t, "cron-"+dev)
	if err := cron.Deliver("d-1", "mobile:"+dev, "from cron on the other node", nil); err != nil {
		t.Fatal(err)
	}
	msg, err = c.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil || msg.Str("text") != "from cron on the other node" {
		t.Fatalf("delivered %v, %v", msg, err)
	}

	start := time.Now()
	c2, _ := b.connect(t, dev)
	ci, err := c.ExpectClose(testCtx(t))
	if err != nil || ci.Code != 1000 {
		t.Fatalf("old socket: close %v, %v", ci, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("takeover across nodes took %v, want under 1 s", d)
	}
	if err := c2.Text("m-1", "dup"); err != nil { // same id: a duplicate across nodes
		t.Fatal(err)
	}
	if err := c2.Text("m-2", "after takeover"); err != nil {
		t.Fatal(err)
	}
	msg, err = c2.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil {
		t.Fatal(err)
	}
	text, _, err = c2.CollectMessage(testCtx(t), msg.Str("id"))
	if err != nil || !strings.Contains(text, "after takeover") {
		t.Fatalf("reply after takeover %q, %v (a reply to the duplicate would come first)", text, err)
	}
}

// TestCachedEpochConfirmedBeforeWrite: a delivery stamped with an epoch
// from the sender's owner cache reaches the old socket's edge after the
// phone's hello on another edge took a newer epoch, but before that hello's
// takeover notice (on a NATS cluster the two cross different routes). The
// edge must not write it into the old socket, which the phone has left:
// it answers moved, so the sender reads the owner again and sends it to
// the new socket.
func TestCachedEpochConfirmedBeforeWrite(t *testing.T) {
	prefix := randomPrefix()
	natsURL, redisURL := clusterURLs(t)
	natsPrefix := strings.NewReplacer(":", ".", "-", "_").Replace(prefix)
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.NATSURL, cfg.RedisURL, cfg.RedisPrefix, cfg.NATSPrefix, cfg.Router = natsURL, redisURL, prefix, natsPrefix, false
		cfg.Edge.OwnerTTL = time.Hour // no heartbeat closes the old socket meanwhile
	})
	dev := "tel-" + prefix[13:25]
	old, _ := n.connect(t, dev)

	ctx := testCtx(t)
	st, err := redisstore.New(ctx, redisstore.Options{URL: redisURL, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, err := natsbus.Connect(natsURL, natsbus.Options{SubjectPrefix: natsPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	owner, err := st.DeviceOwner(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	// The hello on the other edge: a newer epoch, its notice not here yet.
	if _, err := st.ClaimDevice(ctx, dev, "edge-b", time.Minute); err != nil {
		t.Fatal(err)
	}

	data, _ := wire.Marshal(wire.Output{Op: wire.OpMessage, Device: dev, Epoch: owner.Epoch, Cached: true,
		ID: "stale", Text: "stamped from the cache", Final: true})
	reply, err := b.Request(ctx, bus.EdgeOutputSubject(owner.Edge), data, nil)
	if err != nil {
		t.Fatal(err)
	}
	var r wire.Reply
	if err := wire.Unmarshal(reply, &r); err != nil {
		t.Fatal(err)
	}
	if r.OK || !r.Moved {
		t.Errorf("answered %+v for a cached epoch the owner record has moved past; want moved", r)
	}
	// A typing frame after it: whatever the edge wrote comes before.
	typing, _ := wire.Marshal(wire.Output{Op: wire.OpTyping, Device: dev})
	if err := b.Publish(ctx, bus.EdgeOutputSubject(owner.Edge), typing, nil); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := old.Next(ctx)
		if err != nil {
			t.Fatalf("the old socket, waiting for the typing frame: %v", err)
		}
		if f.T() == protocol.TypeMessage && f.Str("id") == "stale" {
			t.Errorf("the old socket got the delivery stamped with its cached epoch: %s", f)
		}
		if f.T() == protocol.TypeTyping {
			break
		}
	}
}
