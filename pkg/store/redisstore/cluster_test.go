package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/storetest"
)

// TestClusterStore runs the conformance suite on a real Redis Cluster of
// three masters, reached through REDIS_MODE=cluster's URL: every script
// touches one slot (a cross-slot one fails with CROSSSLOT), and the sweeps
// (TakeJournals, TakeExpired) find what the shards on every master hold.
func TestClusterStore(t *testing.T) {
	c := testsvc.StartRedisCluster(t, 3, 0)
	prefix := testPrefix()
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := New(t.Context(), Options{URL: c.URL(), Mode: ModeCluster, Prefix: prefix, MaxBlobBytes: 1 << 30})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
	storetest.Clocked(t, func(t *testing.T, clk clock.Clock) store.Store {
		s, err := New(t.Context(), Options{URL: c.URL(), Mode: ModeCluster, Prefix: prefix, Clock: clk})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	})
	// The store-wide outbox bound at its boundary, within one shard, each
	// under a prefix of its own (an empty accounting).
	for name, run := range map[string]func(*testing.T, store.Store, storetest.Pool){
		"OutboxStoreBound":  storetest.OutboxStoreBound,
		"OutboxStoreShares": storetest.OutboxStoreShares,
		"OutboxShareBound":  storetest.OutboxShareBound,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := New(t.Context(), Options{URL: c.URL(), Mode: ModeCluster, Prefix: testPrefix()})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			run(t, s, outboxPool(s))
		})
	}
}

// TestClusterSpread: the state of many devices spreads over every master,
// per kind: device keys (owner, outbox) by the device's own tag, journals,
// cards and blob accounting by their shards. No kind has more than half its
// keys on one of three masters.
func TestClusterSpread(t *testing.T) {
	c := testsvc.StartRedisCluster(t, 3, 0)
	prefix := testPrefix()
	s, err := New(t.Context(), Options{URL: c.URL(), Mode: ModeCluster, Prefix: prefix, MaxBlobBytes: 1 << 30})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	ctx := t.Context()
	const devices = 300
	lim := store.JournalLimits{MaxLen: 10, Lease: time.Minute, TTL: time.Minute}
	for i := range devices {
		d := fmt.Sprintf("tel-%d", i)
		if _, err := s.ClaimDevice(ctx, d, "edge-1", time.Minute); err != nil {
			t.Fatalf("ClaimDevice: %v", err)
		}
		if _, err := s.PushOutbox(ctx, d, []byte("item"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute}); err != nil {
			t.Fatalf("PushOutbox: %v", err)
		}
		if _, err := s.AppendJournal(ctx, d, "router-1", []byte("ev"), lim); err != nil {
			t.Fatalf("AppendJournal: %v", err)
		}
		p := store.PromptRecord{ID: fmt.Sprintf("card-%d", i), Device: d, Kind: "approval", Expires: time.Now().Add(time.Minute)}
		if err := s.PutPrompt(ctx, p); err != nil {
			t.Fatalf("PutPrompt: %v", err)
		}
		if _, err := s.PutBlob(ctx, []byte("blob"), time.Minute); err != nil {
			t.Fatalf("PutBlob: %v", err)
		}
	}
	kinds := map[string]string{"owner": "owner:{", "outbox": "outbox:{", "journal": ":log:", "card": ":card:", "blob accounting": "}:bytes"}
	perMaster := map[string][]int{}
	var mu sync.Mutex // ForEachMaster calls in parallel
	err = s.rdb.(*redis.ClusterClient).ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		ks, err := m.Keys(ctx, prefix+"*").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for kind, mark := range kinds {
			n := 0
			for _, k := range ks {
				if strings.Contains(k, mark) {
					n++
				}
			}
			perMaster[kind] = append(perMaster[kind], n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the masters: %v", err)
	}
	if masters := len(perMaster["owner"]); masters != 3 {
		t.Fatalf("read %d masters, want 3", masters)
	}
	for kind, counts := range perMaster {
		total := 0
		for _, n := range counts {
			total += n
		}
		for _, n := range counts {
			if n == 0 || n > total/2 {
				t.Errorf("%s keys per master %v: want some on every master, none with over half", kind, counts)
				break
			}
		}
	}
}
