package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// sleepTests are the bounds of what the store keeps for a phone that
// sleeps: bytes per device and across the store, the drops reported, and
// media kept as long as the outbox items that refer to them.
var sleepTests = []test{
	{"DeviceBytesAtBoundary", testSleepDeviceBytes},
	{"DropsReported", testSleepDropsReported},
	{"StoreBytes", testSleepStoreBytes},
	{"StoreFlood", testSleepStoreFlood},
	{"StoreFloodShares", testSleepStoreFloodShares},
	{"ShareFlood", testSleepShareFlood},
	{"ExtendBlob", testSleepExtendBlob},
	{"ExtendBlobUnknown", testSleepExtendBlobUnknown},
	{"PushTarget", testSleepPushTarget},
	{"PushTargetExpires", testSleepPushTargetExpires},
}

// testSleepPushTarget: a target is kept, replaced, read back as written,
// and forgotten.
func testSleepPushTarget(t *testing.T, s store.Store) {
	ctx := t.Context()
	dev := name(t, "dev")
	if _, err := s.PushTarget(ctx, dev); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("PushTarget(none) = %v, want ErrNotFound", err)
	}
	for _, target := range []string{`{"kind":"ntfy"}`, `{"kind":"webhook"}`} {
		if err := s.SetPushTarget(ctx, dev, []byte(target), time.Minute); err != nil {
			t.Fatalf("SetPushTarget: %v", err)
		}
		if got, err := s.PushTarget(ctx, dev); err != nil || string(got) != target {
			t.Fatalf("PushTarget = %q, %v; want %q", got, err, target)
		}
	}
	if err := s.DeletePushTarget(ctx, dev); err != nil {
		t.Fatalf("DeletePushTarget: %v", err)
	}
	if _, err := s.PushTarget(ctx, dev); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("PushTarget(deleted) = %v, want ErrNotFound", err)
	}
	if err := s.DeletePushTarget(ctx, dev); err != nil {
		t.Fatalf("DeletePushTarget(none): %v", err)
	}
}

func testSleepPushTargetExpires(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	if err := s.SetPushTarget(t.Context(), dev, []byte("x"), time.Second); err != nil {
		t.Fatalf("SetPushTarget: %v", err)
	}
	eventually(t, expiryWait, "the target expired", func() bool {
		_, err := s.PushTarget(t.Context(), dev)
		return errors.Is(err, store.ErrNotFound)
	})
}

func pushLim(t *testing.T, s store.Store, device, item string, lim store.OutboxLimits) store.OutboxDrops {
	t.Helper()
	d, err := s.PushOutbox(t.Context(), device, []byte(item), lim)
	if err != nil {
		t.Fatalf("PushOutbox(%d bytes): %v", len(item), err)
	}
	return d
}

func wantDrops(t *testing.T, got, want store.OutboxDrops) {
	t.Helper()
	if got != want {
		t.Fatalf("drops = %+v, want %+v", got, want)
	}
}

// testSleepDeviceBytes: exactly MaxBytes of items is kept; one byte more
// drops the oldest; an item longer than MaxBytes is not kept and drops
// nothing.
func testSleepDeviceBytes(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := store.OutboxLimits{MaxItems: 100, MaxBytes: 10, TTL: time.Minute}
	wantDrops(t, pushLim(t, s, dev, "aaaaa", lim), store.OutboxDrops{})
	wantDrops(t, pushLim(t, s, dev, "bbbbb", lim), store.OutboxDrops{})
	wantOutbox(t, s, dev, "aaaaa", "bbbbb") // 10 bytes: the bound
	wantDrops(t, pushLim(t, s, dev, "c", lim), store.OutboxDrops{Bytes: 1})
	wantOutbox(t, s, dev, "bbbbb", "c")
	wantDrops(t, pushLim(t, s, dev, strings.Repeat("x", 11), lim), store.OutboxDrops{Bytes: 1})
	wantOutbox(t, s, dev, "bbbbb", "c")
	ten := strings.Repeat("y", 10)
	wantDrops(t, pushLim(t, s, dev, ten, lim), store.OutboxDrops{Bytes: 2})
	wantOutbox(t, s, dev, ten)
	// An acknowledged item no longer counts.
	epoch := claimDevice(t, s, dev, "edge-1", time.Minute)
	ack(t, s, dev, epoch, 1<<62, true)
	wantDrops(t, pushLim(t, s, dev, "zzzzz", lim), store.OutboxDrops{})
	wantDrops(t, pushLim(t, s, dev, "wwwww", lim), store.OutboxDrops{})
	wantOutbox(t, s, dev, "zzzzz", "wwwww")
}

// testSleepDropsReported: a push reports the items it pushed out past
// MaxItems; MaxItems below 1 drops the whole outbox.
func testSleepDropsReported(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := store.OutboxLimits{MaxItems: 3, TTL: time.Minute}
	for i := 1; i <= 3; i++ {
		wantDrops(t, pushLim(t, s, dev, fmt.Sprint(i), lim), store.OutboxDrops{})
	}
	wantDrops(t, pushLim(t, s, dev, "4", lim), store.OutboxDrops{Full: 1})
	wantOutbox(t, s, dev, "2", "3", "4")
	wantDrops(t, pushLim(t, s, dev, "5", store.OutboxLimits{MaxItems: 0, TTL: time.Minute}), store.OutboxDrops{Full: 3})
	wantOutbox(t, s, dev)
}

// testSleepStoreBytes: past MaxStoreBytes the oldest items are dropped,
// across devices, and reported; what stays is at most MaxStoreBytes, each
// device keeps its newest items, and an item longer than the bound is not
// kept. (redisstore bounds each of its shards by a part of MaxStoreBytes on
// Redis Cluster, so the test holds there too.)
func testSleepStoreBytes(t *testing.T, s store.Store) {
	devs := []string{name(t, "a"), name(t, "b")}
	defer sharePool(t, s, devs...)()
	const maxStore = 1600
	lim := store.OutboxLimits{MaxItems: 1000, MaxStoreBytes: maxStore, TTL: time.Minute}
	pushed := map[string][]string{}
	dropped := 0
	for i := range 40 {
		dev := devs[i%2]
		item := fmt.Sprintf("%02d", i) + strings.Repeat(".", 48)
		d := pushLim(t, s, dev, item, lim)
		if d.Full+d.Bytes+d.Expired != 0 {
			t.Fatalf("push %d dropped %+v: only the store bound may drop", i, d)
		}
		dropped += d.Store
		pushed[dev] = append(pushed[dev], item)
	}
	kept, keptBytes := 0, 0
	for _, dev := range devs {
		got := itemData(peek(t, s, dev, 0))
		all := pushed[dev]
		if len(got) == 0 || !slices.Equal(got, all[len(all)-len(got):]) {
			t.Fatalf("device %d keeps %d items, want its newest (at least its last)", slices.Index(devs, dev), len(got))
		}
		kept += len(got)
		for _, it := range got {
			keptBytes += len(it)
		}
	}
	if keptBytes > maxStore {
		t.Fatalf("the store keeps %d bytes of outbox items, bound %d", keptBytes, maxStore)
	}
	if dropped == 0 || dropped != 40-kept {
		t.Fatalf("drops reported %d, items gone %d", dropped, 40-kept)
	}
	big := strings.Repeat("z", maxStore+1)
	wantDrops(t, pushLim(t, s, devs[0], big, lim), store.OutboxDrops{Store: 1})
	if got := itemData(peek(t, s, devs[0], 0)); slices.Contains(got, big) {
		t.Fatal("an item longer than the store bound was kept")
	}
}

// testSleepExtendBlob: a blob extended lives past its first ttl; extending
// with a shorter ttl does not shorten it.
func testSleepExtendBlob(t *testing.T, s store.Store) {
	ctx := t.Context()
	data := []byte("media")
	short := putBlob(t, s, data, time.Second)
	extended := putBlob(t, s, data, time.Second)
	long := putBlob(t, s, data, time.Minute)
	if err := s.ExtendBlob(ctx, extended, time.Minute); err != nil {
		t.Fatalf("ExtendBlob: %v", err)
	}
	if err := s.ExtendBlob(ctx, long, time.Millisecond); err != nil {
		t.Fatalf("ExtendBlob(shorter): %v", err)
	}
	eventually(t, expiryWait, "the blob not extended expired", func() bool {
		_, err := s.GetBlob(ctx, short)
		return errors.Is(err, store.ErrNotFound)
	})
	for _, key := range []string{extended, long} {
		got, err := s.GetBlob(ctx, key)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("GetBlob(extended) = %q, %v; want it kept", got, err)
		}
	}
}

func testSleepExtendBlobUnknown(t *testing.T, s store.Store) {
	if err := s.ExtendBlob(t.Context(), "0123456789abcdef0123456789abcdef", time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("ExtendBlob(unknown) = %v, want ErrNotFound", err)
	}
}

// testSleepShareFlood is an owner (a share with MaxShareBytes, its
// outbox_mib) flooding its own sleeping devices, far past its bound, while
// another owner's phone sleeps with one queued cron message: the flood
// keeps at most its bound (on Redis Cluster each shard at most its part of
// it) and loses its own oldest, and the other owner's message stays.
func testSleepShareFlood(t *testing.T, s store.Store) {
	real := name(t, "phone")
	fake := make([]string, 20)
	for i := range fake {
		fake[i] = name(t, fmt.Sprintf("sleeping-%02d", i))
	}
	defer sharePool(t, s, append([]string{real}, fake...)...)()
	const msg = `{"op":"message","id":"cron-1","text":"7:00 standup","offline":true}`
	lim := store.OutboxLimits{MaxItems: 1024, MaxShareBytes: 16 * 200, TTL: time.Minute}
	wantDrops(t, pushShare(t, s, real, name(t, "owner:b"), msg, lim), store.OutboxDrops{})
	flood := name(t, "owner:a")
	pushed, dropped := 0, 0
	for i := range 10 {
		for _, dev := range fake {
			answer := fmt.Sprintf(`{"op":"message","id":"m-%d","text":"%s","offline":true}`, i, strings.Repeat("a", 20))
			d := pushShare(t, s, dev, flood, answer, lim)
			if d.Full+d.Bytes+d.Store+d.Expired != 0 {
				t.Fatalf("push dropped %+v: only the share's bound may drop", d)
			}
			pushed += len(answer)
			dropped += d.Share
		}
	}
	kept, keptItems := 0, 0
	for _, dev := range fake {
		for _, it := range peek(t, s, dev, 0) {
			kept += len(it.Data)
			keptItems++
		}
	}
	t.Logf("%d bytes pushed past a share bound of %d: %d items dropped, %d bytes kept", pushed, lim.MaxShareBytes, dropped, kept)
	if dropped == 0 || int64(kept) > lim.MaxShareBytes {
		t.Fatalf("the flood kept %d bytes (%d dropped), want at most its bound %d", kept, dropped, lim.MaxShareBytes)
	}
	if dropped != 200-keptItems {
		t.Fatalf("drops reported %d, items gone %d", dropped, 200-keptItems)
	}
	if got := itemData(peek(t, s, real, 0)); !slices.Equal(got, []string{msg}) {
		t.Fatalf("the other owner's queued message was dropped by the flood (%d items left)", len(got))
	}
}
