package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/storetest"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// TestOutboxStoreShares: the share level of the store-wide outbox bound,
// on one server.
func TestOutboxStoreShares(t *testing.T) {
	t.Parallel()
	s := newStore(t, testsvc.StartRedis(t).URL(), Options{})
	storetest.OutboxStoreShares(t, s, storetest.Pool{})
}

// TestOutboxShareBound: the per-share outbox bound at its boundary, on
// one server.
func TestOutboxShareBound(t *testing.T) {
	t.Parallel()
	s := newStore(t, testsvc.StartRedis(t).URL(), Options{})
	storetest.OutboxShareBound(t, s, storetest.Pool{})
}

// outboxPool is the storetest.Pool of s: its shards of the outbox
// accounting.
func outboxPool(s *Store) storetest.Pool {
	return storetest.Pool{Parts: len(s.tags.outbox), Same: func(a, b string) bool {
		return s.tags.outbox.of(a) == s.tags.outbox.of(b)
	}}
}

// shim(v0.2.0): the release before, for TestOutboxUpgrade.
//
// legacyAccountOutboxScript is accountOutboxScript of the release before
// the holders: nearest deadline first, in {outbox}:due and {outbox}:bytes.
// The tests write with it what that release left in a Redis, and what its
// nodes write during a rolling upgrade.
var legacyAccountOutboxScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local past = '(' .. string.format('%.0f', now)
local function size(m)
	return tonumber(string.match(m, '^(%d+):'))
end
local freed = 0
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', past)
for _, m in ipairs(old) do
	freed = freed + size(m)
end
if #old > 0 then
	redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', past)
end
for i = 6, #ARGV do
	if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
		freed = freed + size(ARGV[i])
	end
end
if freed > 0 then
	redis.call('DECRBY', KEYS[2], freed)
end
local out = {}
if ARGV[1] == '' then
	return out
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local total = redis.call('INCRBY', KEYS[2], ARGV[3])
local part = tonumber(ARGV[4])
while part > 0 and total > part do
	local m = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
	redis.call('ZREM', KEYS[1], m)
	total = redis.call('DECRBY', KEYS[2], size(m))
	out[#out + 1] = m
end
local ttl = tonumber(ARGV[5])
for _, k in ipairs(KEYS) do
	if redis.call('PTTL', k) < ttl + 1 then
		redis.call('PEXPIRE', k, ttl + 1)
	end
end
return out
`)

// legacyPush is PushOutbox of the release before the holders.
func legacyPush(t *testing.T, s *Store, device, item string, lim store.OutboxLimits) {
	t.Helper()
	ctx := t.Context()
	keys := []string{s.outboxKey(device), s.outboxSeqKey(device), s.outboxBytesKey(device)}
	part := lim.MaxStoreBytes // one server: one part
	r, err := pushOutboxScript.Run(ctx, s.rdb, keys, item, lim.MaxItems, ms(lim.TTL), lim.MaxBytes, part).Slice()
	if err != nil {
		t.Fatal(err)
	}
	seq, deadline := fmt.Sprint(r[0]), r[1]
	var gone []any
	for _, g := range r[7:] {
		gone = append(gone, fmt.Sprint(g)+":"+device)
	}
	pk := s.outboxPoolKeys(0)
	args := append([]any{strconv.Itoa(len(item)) + ":" + seq + ":" + device, deadline, len(item), part, ms(lim.TTL)}, gone...)
	taken, err := legacyAccountOutboxScript.Run(ctx, s.rdb, pk[:2], args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range taken {
		if _, err := s.evictOutbox(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

func wantItems(t *testing.T, s *Store, device string, want ...string) {
	t.Helper()
	items, err := s.PeekOutbox(t.Context(), device, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range items {
		got = append(got, string(it.Data))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s's outbox %q, want %q", device, got, want)
	}
}

func push(t *testing.T, s *Store, device, share, item string, lim store.OutboxLimits) store.OutboxDrops {
	t.Helper()
	lim.Share = share
	d, err := s.PushOutbox(t.Context(), device, []byte(item), lim)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestOutboxUpgrade: the items a single server holds from the release
// before the holders (counted in {outbox}:due and :bytes, nearest deadline
// first), and those its nodes push during a rolling upgrade, are still
// delivered and acknowledged. Until they leave they count against the
// bound as one holder of their own, dropped nearest deadline first when it
// holds the most; an acknowledgement or a deadline takes them out of the
// old count, which is empty once they are gone.
//
// shim(v0.2.0): tests the accounting of the release before.
func TestOutboxUpgrade(t *testing.T) {
	t.Parallel()
	s := newStore(t, testsvc.StartRedis(t).URL(), Options{})
	ctx := t.Context()
	lim := store.OutboxLimits{MaxItems: 100, MaxStoreBytes: 50, TTL: time.Minute}
	legacyPush(t, s, "l1", "1111111111", lim)
	legacyPush(t, s, "l2", "2222222222", lim)
	legacyPush(t, s, "l3", "3333333333", lim)
	pk := s.outboxPoolKeys(0)
	count := func(key string) int64 {
		n, err := s.rdb.Get(ctx, key).Int64()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		return n
	}
	if count(pk[1]) != 30 {
		t.Fatalf("the old count holds %d bytes, want 30", count(pk[1]))
	}
	// New pushes count apart; the old items are still read and acknowledged.
	if d := push(t, s, "n", "x", "nnnnnnnnnnnnnnnnnnnn", lim); d.Total() != 0 {
		t.Fatalf("drops %+v", d)
	}
	wantItems(t, s, "l1", "1111111111")
	epoch, err := s.ClaimDevice(ctx, "l3", "edge-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AckOutbox(ctx, "l3", epoch, 1<<62); !ok || err != nil {
		t.Fatalf("AckOutbox = %v, %v", ok, err)
	}
	wantItems(t, s, "l3")
	if count(pk[1]) != 20 || count(pk[3]) != 20 {
		t.Fatalf("old count %d, new %d; want 20 and 20", count(pk[1]), count(pk[3]))
	}
	// A node of the release before pushes during the upgrade: its item
	// counts in the old count, which holds 30 bytes, with x's 20 the bound.
	legacyPush(t, s, "l4", "4444444444", lim)
	// A byte more: the old items hold more than x, and lose the nearest
	// deadline, l1's.
	if d := push(t, s, "m", "y", "m", lim); d != (store.OutboxDrops{Store: 1}) {
		t.Fatalf("drops %+v, want one past the store bound", d)
	}
	wantItems(t, s, "l1")
	wantItems(t, s, "l2", "2222222222")
	wantItems(t, s, "m", "m")
	// Now x (30 bytes of 61) holds more than the old items (20): n loses
	// its oldest.
	if d := push(t, s, "n", "x", "NNNNNNNNNN", lim); d != (store.OutboxDrops{Store: 1}) {
		t.Fatalf("drops %+v, want one past the store bound", d)
	}
	wantItems(t, s, "n", "NNNNNNNNNN")
	wantItems(t, s, "l2", "2222222222")
	wantItems(t, s, "l4", "4444444444")
	if count(pk[1]) != 20 || count(pk[3]) != 11 {
		t.Fatalf("old count %d, new %d; want 20 and 11", count(pk[1]), count(pk[3]))
	}
	// The old items leave the old count by their deadline too.
	short := lim
	short.TTL = time.Second
	legacyPush(t, s, "l5", "5", short)
	if !testsvc.Eventually(5*time.Second, func() bool {
		items, err := s.PeekOutbox(ctx, "l5", 0)
		return err == nil && len(items) == 0
	}) {
		t.Fatal("l5's item did not expire")
	}
	if d := push(t, s, "m", "y", "", lim); d.Store != 0 {
		t.Fatalf("drops %+v", d)
	}
	if count(pk[1]) != 20 {
		t.Fatalf("the old count holds %d bytes, want 20 (l2's and l4's)", count(pk[1]))
	}
}

// TestOutboxStoreDropMetric: each item the store-wide bound drops counts in
// hermes_outbox_dropped_total{reason="store"}, whichever device held it;
// an item the accounting names but no outbox holds any more does not.
func TestOutboxStoreDropMetric(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	s := newStore(t, testsvc.StartRedis(t).URL(), Options{Telemetry: tel})
	ctx := t.Context()
	const dropped = `hermes_outbox_dropped_total{reason="store"}`
	lim := store.OutboxLimits{MaxItems: 100, MaxStoreBytes: 10, TTL: time.Minute}
	drops := func(device, share, item string, want int) {
		t.Helper()
		if d := push(t, s, device, share, item, lim); d != (store.OutboxDrops{Store: want}) {
			t.Fatalf("push %q to %s: drops %+v, want %d past the store bound", item, device, d, want)
		}
	}
	drops("a", "agent", "aaaaaa", 0)
	drops("b", "deliver", "bbb", 0)
	drops("a", "agent", "a", 0) // 10 bytes: the bound
	drops("b", "deliver", "x", 1)
	wantItems(t, s, "a", "a")
	drops("a", "agent", "aaaaaa", 1)
	wantItems(t, s, "a", "aaaaaa")
	if m := testsvc.Samples(t, tel.Handler()); m[dropped] != 2 {
		t.Fatalf("%s = %v, want 2", dropped, m[dropped])
	}
	// a's item leaves its outbox behind the accounting's back (as a node
	// of the release before acknowledges it). The bound then picks it, the
	// largest holder's oldest: it leaves the count, and no drop is counted.
	if err := s.rdb.LPop(ctx, s.outboxKey("a")).Err(); err != nil {
		t.Fatal(err)
	}
	drops("b", "deliver", "b", 0)
	wantItems(t, s, "b", "bbb", "x", "b")
	if m := testsvc.Samples(t, tel.Handler()); m[dropped] != 2 {
		t.Fatalf("%s = %v, want 2", dropped, m[dropped])
	}
}
