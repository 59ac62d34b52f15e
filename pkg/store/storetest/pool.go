package storetest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// Pool says how a store splits its store-wide outbox bound
// (store.OutboxLimits.MaxStoreBytes): into Parts parts, each bounding the
// devices of one by MaxStoreBytes/Parts (redisstore on Redis Cluster:
// Shards), and Same tells whether two devices share a part. The zero Pool
// is one count (memstore, redisstore on one server).
type Pool struct {
	Parts int
	Same  func(a, b string) bool
}

// devices returns a name for each of whats, all in one part of p.
func (p Pool) devices(t *testing.T, whats ...string) []string {
	out := []string{name(t, whats[0])}
	for _, what := range whats[1:] {
		for k := 0; ; k++ {
			n := name(t, fmt.Sprintf("%s.%d", what, k))
			if p.Same == nil || p.Same(out[0], n) {
				out = append(out, n)
				break
			}
		}
	}
	return out
}

// bound is the MaxStoreBytes that bounds each part of p by part bytes.
func (p Pool) bound(part int64) int64 { return part * int64(max(p.Parts, 1)) }

// poolMu keeps the tests of Run that push with a store-wide bound from
// running at once: on a shared backend (one Redis and prefix) they share
// the pool, and one's pushes would drop the other's items.
var poolMu sync.Mutex

// sharePool holds the store-wide pool of the suite for a test, which calls
// what it returns when it ends (deferred, while its context lives): that
// empties the outboxes of devs, so the pool is as the test found it, and
// lets the next test have it.
func sharePool(t *testing.T, s store.Store, devs ...string) func() {
	poolMu.Lock()
	return func() {
		defer poolMu.Unlock()
		for _, d := range devs {
			ack(t, s, d, claimDevice(t, s, d, "edge-cleanup", time.Minute), 1<<62, true)
		}
	}
}

func pushShare(t *testing.T, s store.Store, device, share, item string, lim store.OutboxLimits) store.OutboxDrops {
	t.Helper()
	lim.Share = share
	return pushLim(t, s, device, item, lim)
}

// OutboxStoreBound checks the store-wide outbox bound at its boundary,
// within one part of p: exactly MaxStoreBytes is kept; a byte more drops
// exactly one item, the oldest of the device holding the most bytes,
// whichever device the push was for (also its own); and the count stays
// exact when items are acknowledged, dropped by a device's own bounds or
// expire. s must not hold outbox items pushed with a store-wide bound.
func OutboxStoreBound(t *testing.T, s store.Store, p Pool) {
	devs := p.devices(t, "a", "b", "c", "d")
	a, b, c, d := devs[0], devs[1], devs[2], devs[3]
	lim := store.OutboxLimits{MaxItems: 100, MaxStoreBytes: p.bound(10), TTL: time.Minute}
	wantDrops(t, pushLim(t, s, a, "aaa", lim), store.OutboxDrops{})
	wantDrops(t, pushLim(t, s, a, "aa", lim), store.OutboxDrops{})
	wantDrops(t, pushLim(t, s, b, "bbbb", lim), store.OutboxDrops{})
	wantDrops(t, pushLim(t, s, c, "c", lim), store.OutboxDrops{})
	// 10 bytes in all: the bound.
	wantOutbox(t, s, a, "aaa", "aa")
	wantOutbox(t, s, b, "bbbb")
	wantOutbox(t, s, c, "c")
	// A byte more: a holds the most (5 bytes), and loses its oldest,
	// although the push was c's; b's older item stays.
	wantDrops(t, pushLim(t, s, c, "C", lim), store.OutboxDrops{Store: 1})
	wantOutbox(t, s, a, "aa")
	wantOutbox(t, s, b, "bbbb")
	wantOutbox(t, s, c, "c", "C")
	// The device pushed to is a holder like any other: b now holds the
	// most (7 of 11 bytes) and loses its own oldest.
	wantDrops(t, pushLim(t, s, b, "bbb", lim), store.OutboxDrops{Store: 1})
	wantOutbox(t, s, b, "bbb")
	// Acknowledged items no longer count: 5 bytes are left ("aa", "bbb"),
	// so 5 more fit exactly.
	epoch := claimDevice(t, s, c, "edge-1", time.Minute)
	ack(t, s, c, epoch, 1<<62, true)
	wantDrops(t, pushLim(t, s, a, "aaaaa", lim), store.OutboxDrops{})
	wantOutbox(t, s, a, "aa", "aaaaa")
	wantOutbox(t, s, b, "bbb")
	// An item longer than the bound is not kept, and drops nothing.
	wantDrops(t, pushLim(t, s, b, strings.Repeat("e", 11), lim), store.OutboxDrops{Store: 1})
	wantOutbox(t, s, b, "bbb")
	wantOutbox(t, s, a, "aa", "aaaaa")

	// Items a device's own bounds drop no longer count: d's first item
	// goes past MaxItems 1, so d holds 1 byte, not 3, and 10 in all.
	epoch = claimDevice(t, s, a, "edge-1", time.Minute)
	ack(t, s, a, epoch, 1<<62, true) // 3 bytes left: "bbb"
	one := lim
	one.MaxItems = 1
	wantDrops(t, pushLim(t, s, d, "dd", one), store.OutboxDrops{})
	wantDrops(t, pushLim(t, s, d, "d", one), store.OutboxDrops{Full: 1})
	wantDrops(t, pushLim(t, s, a, "aaaaaa", lim), store.OutboxDrops{})
	wantOutbox(t, s, a, "aaaaaa")
	wantOutbox(t, s, b, "bbb")
	wantOutbox(t, s, d, "d")
	// Items that expired no longer count.
	short := lim
	short.TTL = time.Second
	ack(t, s, a, epoch, 1<<62, true) // 4 bytes left: "bbb", "d"
	wantDrops(t, pushLim(t, s, a, "xxxxxx", short), store.OutboxDrops{})
	eventually(t, expiryWait, "the item expired", func() bool { return len(peek(t, s, a, 0)) == 0 })
	// (Expired may count it, or the store may have forgotten it before.)
	if d := pushLim(t, s, a, "zzzzzz", lim); d.Full+d.Bytes+d.Store != 0 {
		t.Fatalf("drops = %+v, want none but the expired item", d)
	}
	wantOutbox(t, s, a, "zzzzzz")
	wantOutbox(t, s, b, "bbb")
	wantOutbox(t, s, d, "d")
	wantDrops(t, pushLim(t, s, d, "D", lim), store.OutboxDrops{Store: 1}) // a holds the most
	wantOutbox(t, s, a)
	wantOutbox(t, s, d, "d", "D")
}

// OutboxStoreShares checks the level above the devices, within one part
// of p: past the bound the share holding the most bytes loses first (its
// device holding the most in it, that device's oldest item of that
// share), however much a device of another share holds. s must not hold
// outbox items pushed with a store-wide bound.
func OutboxStoreShares(t *testing.T, s store.Store, p Pool) {
	devs := p.devices(t, "a", "b", "c", "e")
	a, b, c, e := devs[0], devs[1], devs[2], devs[3]
	lim := store.OutboxLimits{MaxItems: 100, MaxStoreBytes: p.bound(20), TTL: time.Minute}
	wantDrops(t, pushShare(t, s, a, "x", "aaaaaa", lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, b, "x", "bbbbb", lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, c, "y", "cccccccc", lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, c, "y", "c", lim), store.OutboxDrops{}) // 20 bytes: the bound
	// x holds 11 bytes, y 10: x loses first, its largest device a its
	// oldest, although c (of y) holds more than any device.
	wantDrops(t, pushShare(t, s, e, "y", "e", lim), store.OutboxDrops{Store: 1})
	wantOutbox(t, s, a)
	wantOutbox(t, s, b, "bbbbb")
	wantOutbox(t, s, c, "cccccccc", "c")
	wantOutbox(t, s, e, "e")
	// b holds items of both shares. Past the bound y (21 bytes) loses: its
	// largest device is b (11 bytes in y), which loses its oldest item of
	// y, not its oldest ("bbbbb", of x); then c (9 of y's 16) its oldest.
	wantDrops(t, pushShare(t, s, b, "y", "BBBBB", lim), store.OutboxDrops{}) // 20 bytes
	wantDrops(t, pushShare(t, s, b, "y", "BBBBBB", lim), store.OutboxDrops{Store: 2})
	wantOutbox(t, s, b, "bbbbb", "BBBBBB")
	wantOutbox(t, s, c, "c")
	wantOutbox(t, s, e, "e")
	// An acknowledged item leaves its share too: with b's items gone, x
	// holds nothing, and y's 2 bytes leave room for 18 exactly.
	epoch := claimDevice(t, s, b, "edge-1", time.Minute)
	ack(t, s, b, epoch, 1<<62, true)
	wantDrops(t, pushShare(t, s, a, "x", strings.Repeat("A", 18), lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, e, "y", "E", lim), store.OutboxDrops{Store: 1})
	wantOutbox(t, s, a)
	wantOutbox(t, s, c, "c")
	wantOutbox(t, s, e, "e", "E")
}

// testSleepStoreFlood is the attack of the security review: a token that
// may name any device makes up 40 devices, and the agent answers each 10
// times into its outbox, far past the store-wide bound, while a real phone
// sleeps with one queued cron message (shorter-lived than the flood's, so
// the nearest deadline in the store). Each made-up device holds more than
// the phone, so the phone's message is never the largest holder's: it
// stays. (On Redis Cluster the bound is split over the shards: the phone's
// shard drops the made-up devices of its shard the same way.)
func testSleepStoreFlood(t *testing.T, s store.Store) {
	real := name(t, "phone")
	fake := make([]string, 40)
	for i := range fake {
		fake[i] = name(t, fmt.Sprintf("made-up-%02d", i))
	}
	defer sharePool(t, s, append([]string{real}, fake...)...)()
	const msg = `{"op":"message","id":"cron-1","text":"7:00 standup","offline":true}`
	lim := store.OutboxLimits{MaxItems: 1024, MaxStoreBytes: 4000, TTL: 30 * time.Second}
	wantDrops(t, pushShare(t, s, real, "deliver", msg, lim), store.OutboxDrops{})
	lim.TTL = time.Minute
	pushed, dropped := 0, 0
	for i := range 10 {
		for _, dev := range fake {
			answer := fmt.Sprintf(`{"op":"message","id":"m-%d","text":"%s","offline":true}`, i, strings.Repeat("a", 51))
			d := pushShare(t, s, dev, "app", answer, lim)
			if d.Full+d.Bytes+d.Expired != 0 {
				t.Fatalf("push dropped %+v: only the store bound may drop", d)
			}
			pushed++
			dropped += d.Store
		}
	}
	phone := itemData(peek(t, s, real, 0))
	kept := len(phone)
	for _, dev := range fake {
		kept += len(peek(t, s, dev, 0))
	}
	t.Logf("%d items pushed past a bound of %d bytes: %d dropped, %d kept, the phone's message %s",
		pushed+1, lim.MaxStoreBytes, dropped, kept, map[bool]string{true: "kept", false: "dropped"}[len(phone) == 1])
	if dropped == 0 {
		t.Fatal("the flood dropped nothing: it must pass the bound")
	}
	if !slices.Equal(phone, []string{msg}) {
		t.Fatalf("the phone's queued message was dropped by the flood (%d items left)", len(phone))
	}
	if dropped != pushed+1-kept {
		t.Fatalf("drops reported %d, items gone %d", dropped, pushed+1-kept)
	}
}

// testSleepStoreFloodShares is the flood against a phone whose queued
// message is larger than what any made-up device holds: by devices alone
// the phone would lose it. The message is charged to the deliver token's
// share, the flood to the app token's, which holds the most.
func testSleepStoreFloodShares(t *testing.T, s store.Store) {
	real := name(t, "phone")
	fake := make([]string, 40)
	for i := range fake {
		fake[i] = name(t, fmt.Sprintf("made-up-%02d", i))
	}
	defer sharePool(t, s, append([]string{real}, fake...)...)()
	msg := `{"op":"message","id":"cron-2","text":"` + strings.Repeat("r", 1960) + `"}`
	answer := func(i int) string {
		return fmt.Sprintf(`{"op":"message","id":"m-%d","text":"%s"}`, i, strings.Repeat("a", 155))
	}
	if len(msg) != 2000 || 10*len(answer(0)) >= len(msg) {
		t.Fatalf("the phone's message (%d bytes) must hold more than any made-up device (%d)", len(msg), 10*len(answer(0)))
	}
	// 16 parts of 4000 bytes on Redis Cluster: the phone's part holds
	// its 2000 bytes and whatever of the flood lands there.
	lim := store.OutboxLimits{MaxItems: 1024, MaxStoreBytes: 64000, TTL: 30 * time.Second}
	wantDrops(t, pushShare(t, s, real, "deliver", msg, lim), store.OutboxDrops{})
	lim.TTL = time.Minute
	dropped := 0
	for i := range 10 {
		for _, dev := range fake {
			dropped += pushShare(t, s, dev, "app", answer(i), lim).Store
		}
	}
	got := itemData(peek(t, s, real, 0))
	t.Logf("401 items pushed past a bound of %d bytes: %d dropped, the phone's message %s",
		lim.MaxStoreBytes, dropped, map[bool]string{true: "kept", false: "dropped"}[len(got) == 1])
	if dropped == 0 {
		t.Fatal("the flood dropped nothing: it must pass the bound")
	}
	if !slices.Equal(got, []string{msg}) {
		t.Fatalf("the phone's queued message was dropped by the flood (%d items left)", len(got))
	}
}

// OutboxShareBound checks the per-share bound (MaxShareBytes) at its
// boundary, within one part of p: exactly the bound is kept; a byte more
// drops the share's own oldest, of its device holding the most (also the
// device pushed to), and nothing of another share; an item longer than the
// bound is not kept; an acknowledged item leaves the share.
func OutboxShareBound(t *testing.T, s store.Store, p Pool) {
	devs := p.devices(t, "a", "b", "c", "o")
	a, b, c, o := devs[0], devs[1], devs[2], devs[3]
	defer sharePool(t, s, devs...)()
	x, y := name(t, "owner:x"), name(t, "owner:y")
	lim := store.OutboxLimits{MaxItems: 100, MaxShareBytes: p.bound(10), TTL: time.Minute}
	wantDrops(t, pushShare(t, s, o, y, "ooooooooo", lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, a, x, "aaa", lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, a, x, "aa", lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, b, x, "bbbb", lim), store.OutboxDrops{})
	wantDrops(t, pushShare(t, s, c, x, "c", lim), store.OutboxDrops{})
	// x holds 10 bytes, the bound; y 9, its own.
	wantOutbox(t, s, a, "aaa", "aa")
	// One byte more: a, which holds the most of x, loses its oldest.
	wantDrops(t, pushShare(t, s, c, x, "cc", lim), store.OutboxDrops{Share: 1})
	wantOutbox(t, s, a, "aa")
	wantOutbox(t, s, c, "c", "cc")
	// c holds the most once "cccc" is in: it loses its own oldest, twice.
	wantDrops(t, pushShare(t, s, c, x, "cccc", lim), store.OutboxDrops{Share: 2})
	wantOutbox(t, s, c, "cccc")
	wantOutbox(t, s, b, "bbbb")
	// Longer than the bound: not kept, nothing dropped.
	wantDrops(t, pushShare(t, s, a, x, strings.Repeat("A", int(lim.MaxShareBytes/int64(max(p.Parts, 1)))+1), lim), store.OutboxDrops{Share: 1})
	wantOutbox(t, s, a, "aa")
	// An acknowledged item leaves the share: b's 4 bytes are room again.
	ack(t, s, b, claimDevice(t, s, b, "edge-1", time.Minute), 1<<62, true)
	wantDrops(t, pushShare(t, s, b, x, "bbbb", lim), store.OutboxDrops{})
	wantOutbox(t, s, a, "aa")
	wantOutbox(t, s, b, "bbbb")
	wantOutbox(t, s, c, "cccc")
	// The other share lost nothing.
	wantOutbox(t, s, o, "ooooooooo")
}
