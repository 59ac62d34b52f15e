package gateway_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/gateway"
)

// TestIdlePhonesCostTheStoreNothing: an edge on its own Redis holds 60
// idle phones over three heartbeats. The heartbeat used to run a script
// per phone (refreshing its owner record) every third of the owner TTL:
// 60 scripts a beat, half of an idle phone's whole server cost at 19,000
// phones. It now renews the edge's lease, one script a beat, and the
// phones' records stand on it; each phone is still found.
func TestIdlePhonesCostTheStoreNothing(t *testing.T) {
	const phones = 60
	d := flStartDeps(t)
	n := d.node(t, false, func(cfg *gateway.Config) { cfg.Edge.OwnerTTL = 3 * time.Second })
	for i := range phones {
		n.connect(t, fmt.Sprintf("idle-%d", i))
	}
	rdb := redis.NewClient(&redis.Options{Addr: d.redis.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := testCtx(t)
	lease := "hermes:edge:{" + n.Edge.ID() + "}"
	// A beat renews the lease: its remaining time goes up.
	pttl := func() time.Duration { return rdb.PTTL(ctx, lease).Val() }
	beat := func() {
		t.Helper()
		prev := pttl()
		testsvc.WaitFor(t, 10*time.Second, "the edge's heartbeat to renew its lease", func() bool {
			cur := pttl()
			up := cur > prev
			prev = cur
			return up
		})
	}
	scripts := func() int64 {
		info := rdb.Info(ctx, "commandstats").Val()
		var n int64
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd+"calls="); ok {
					v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
					n += v
				}
			}
		}
		return n
	}
	beat()
	before := scripts()
	for range 3 {
		beat()
	}
	perBeat := float64(scripts()-before) / 3
	t.Logf("%d idle phones: %.1f Redis scripts a heartbeat", phones, perBeat)
	if perBeat >= phones/2 {
		t.Fatalf("%d idle phones cost %.1f Redis scripts a heartbeat: a write per phone", phones, perBeat)
	}
	owners, err := n.Store.DeviceOwners(ctx, []string{"idle-0", fmt.Sprintf("idle-%d", phones-1)})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range owners {
		if o.Edge != n.Edge.ID() {
			t.Fatalf("after three heartbeats an idle phone's owner reads %v, want this edge", o)
		}
	}
}
