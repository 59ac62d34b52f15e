package router_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
)

// scriptCounter counts the scripts run with device among their arguments.
type scriptCounter struct {
	device string
	n      atomic.Int64
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && slices.Contains(cmd.Args(), any(h.device)) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestJournalEventCostsTwoScripts: an event for a device with an empty
// journal costs the router two store round trips: the append, which takes
// the lease and hands the new worker its entry, and the read that removes
// the entry once handled and releases the lease. No read in between.
func TestJournalEventCostsTwoScripts(t *testing.T) {
	e := newJournalEnv(t)
	opts, err := redis.ParseURL(e.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	dev := "jt-cost-" + testsvc.RandomHex(3)
	count := &scriptCounter{device: dev}
	rdb.AddHook(count)
	st, err := redisstore.New(t.Context(), redisstore.Options{Client: rdb, Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	b, err := natsbus.Connect(e.natsURL, natsbus.Options{Name: "cost", SubjectPrefix: e.subj})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	rec := newRecorder(t).as("r1")
	r := router.New(router.Config{}, st, b, rec, testLogger(t, "r1"))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })

	// Another device first, so that the scripts are loaded (a first
	// EVALSHA can fail with NOSCRIPT and be sent again as EVAL).
	warm := "jt-warm-" + testsvc.RandomHex(3)
	e.mustSend(t, warm, "w1")
	rec.waitHandled(t, 10*time.Second, warm+"/w1")
	e.mustSend(t, dev, "e1")
	rec.waitHandled(t, 10*time.Second, dev+"/e1")
	logKey := e.prefix + "{journals}:log:" + dev
	testsvc.WaitFor(t, 10*time.Second, "the journal of "+dev+" to let go of the handled event",
		func() bool { return rdb.Exists(t.Context(), logKey).Val() == 0 })
	if n := count.n.Load(); n != 2 {
		t.Fatalf("one event cost %d journal scripts, want 2 (append, then remove and release)", n)
	}
}
