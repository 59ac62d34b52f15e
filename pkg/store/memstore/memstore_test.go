package memstore

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/storetest"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return New(Options{}) })
	storetest.Clocked(t, func(t *testing.T, c clock.Clock) store.Store { return New(Options{Clock: c}) })
}

// TestStoreSweeping runs the suite with a sweeper that runs all the time, so
// that sweeping races every method.
func TestStoreSweeping(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return New(Options{SweepInterval: time.Millisecond}) })
}

func newStore(t *testing.T, opts Options) *Store {
	s := New(opts)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestDefaults(t *testing.T) {
	s := newStore(t, Options{MaxBlobBytes: -1, MaxDedupKeys: -1})
	if s.blobs.max != 1<<30 {
		t.Errorf("default MaxBlobBytes = %d, want 1 GiB", s.blobs.max)
	}
	if s.dedup.max != 1_000_000 {
		t.Errorf("default MaxDedupKeys = %d, want 1,000,000", s.dedup.max)
	}
}

func TestMaxBlobBytes(t *testing.T) {
	s := newStore(t, Options{MaxBlobBytes: 100})
	ctx := t.Context()
	k1, err := s.PutBlob(ctx, bytes.Repeat([]byte("a"), 60), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := s.PutBlob(ctx, bytes.Repeat([]byte("b"), 40), time.Minute)
	if err != nil {
		t.Fatalf("PutBlob up to exactly MaxBlobBytes: %v", err)
	}
	if _, err := s.PutBlob(ctx, []byte("c"), time.Minute); !errors.Is(err, store.ErrFull) {
		t.Fatalf("PutBlob one byte over MaxBlobBytes = %v, want ErrFull", err)
	}
	if _, err := s.PutBlob(ctx, nil, time.Minute); err != nil {
		t.Fatalf("PutBlob of nothing when full: %v", err)
	}
	for key, want := range map[string]byte{k1: 'a', k2: 'b'} {
		if got, err := s.GetBlob(ctx, key); err != nil || len(got) == 0 || got[0] != want {
			t.Fatalf("GetBlob after ErrFull = %q, %v", got, err)
		}
	}
	if got := s.blobs.size(); got != 100 {
		t.Fatalf("blob bytes = %d, want 100", got)
	}
}

func TestMaxBlobBytesCountsLiveBlobs(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	s := newStore(t, Options{MaxBlobBytes: 10, SweepInterval: time.Hour, Clock: clk})
	ctx := t.Context()
	if _, err := s.PutBlob(ctx, make([]byte, 10), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	clk.Advance(50*time.Millisecond - 1)
	if _, err := s.PutBlob(ctx, make([]byte, 10), time.Minute); !errors.Is(err, store.ErrFull) {
		t.Fatalf("PutBlob when full (the old blob has 1ns to live) = %v, want ErrFull", err)
	}
	clk.Advance(1)
	// The sweeper has not run: PutBlob itself must not count the expired blob.
	if _, err := s.PutBlob(ctx, make([]byte, 10), time.Minute); err != nil {
		t.Fatalf("PutBlob after the old blob expired: %v", err)
	}
}

func TestMaxDedupKeys(t *testing.T) {
	s := newStore(t, Options{MaxDedupKeys: 3})
	ctx := t.Context()
	claim := func(key, attempt string) bool {
		t.Helper()
		ok, err := s.Claim(ctx, key, attempt, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	wantSeen := func(want ...string) {
		t.Helper()
		var got []string
		s.dedup.mu.Lock()
		for _, k := range []string{"k1", "k2", "k3", "k4", "k5", "k6"} {
			if _, ok := s.dedup.keys[k]; ok { // pending or confirmed
				got = append(got, k)
			}
		}
		s.dedup.mu.Unlock()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("recorded keys %v, want %v", got, want)
		}
	}
	claim("k1", "a")
	claim("k2", "a")
	claim("k3", "a")
	wantSeen("k1", "k2", "k3") // exactly MaxDedupKeys
	claim("k1", "a")           // a retry does not make k1 younger
	claim("k4", "a")
	wantSeen("k2", "k3", "k4") // the oldest, k1, evicted
	if !claim("k1", "b") {
		t.Fatal("Claim of an evicted key = false, want true")
	}
	wantSeen("k1", "k3", "k4")
	if err := s.Release(ctx, "k3", "a"); err != nil {
		t.Fatal(err)
	}
	claim("k5", "a") // a released key frees its place: nothing evicted
	wantSeen("k1", "k4", "k5")
	claim("k6", "a")
	wantSeen("k1", "k5", "k6")
	if n := s.dedup.len(); n != 3 {
		t.Fatalf("%d keys recorded, want 3", n)
	}
}

func TestSweeperRemovesExpired(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	s := newStore(t, Options{SweepInterval: time.Millisecond, Clock: clk})
	ctx := t.Context()
	const ttl = 30 * time.Millisecond
	for i := range 10 {
		k := fmt.Sprint("k", i)
		if _, err := s.Claim(ctx, k, "a", ttl); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ClaimDevice(ctx, k, "edge", ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.SetDeviceAcks(ctx, k, ttl); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PushOutbox(ctx, k, []byte("x"), store.OutboxLimits{MaxItems: 10, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutBlob(ctx, []byte("blob"), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.PutPrompt(ctx, store.PromptRecord{ID: k, Device: k, Expires: clk.Now().Add(ttl)}); err != nil {
			t.Fatal(err)
		}
	}
	if s.dedup.len() != 10 || s.owners.len() != 20 || s.outbox.len() != 10 || s.blobs.size() != 40 {
		t.Fatalf("before expiry: %d keys, %d owner and acks records, %d outboxes, %d blob bytes",
			s.dedup.len(), s.owners.len(), s.outbox.len(), s.blobs.size())
	}
	clk.Advance(ttl)
	if !testsvc.Eventually(5*time.Second, func() bool {
		return s.dedup.len()+s.owners.len()+s.outbox.len()+int(s.blobs.size()) == 0
	}) {
		t.Fatalf("not swept: %d keys, %d owners, %d outboxes, %d blob bytes",
			s.dedup.len(), s.owners.len(), s.outbox.len(), s.blobs.size())
	}
	// Expired cards wait for TakeExpired: that is how their expiry is reported.
	recs, err := s.TakeExpired(ctx, clk.Now(), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 10 {
		t.Fatalf("TakeExpired after sweeping returned %d cards, want 10", len(recs))
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Expires.Before(recs[i-1].Expires) {
			t.Fatalf("TakeExpired not earliest first: %v after %v", recs[i].Expires, recs[i-1].Expires)
		}
	}
}

func TestUploadsForgetIdleDevices(t *testing.T) {
	s := newStore(t, Options{})
	ctx := t.Context()
	lim := store.UploadLimits{MaxOpen: 1, MaxFileBytes: 10, MaxBytes: 10}
	parts := []store.Part{
		{Device: "d1", Conn: "c", ID: "f", Index: 0, Count: 2, Data: []byte("a")}, // dropped below
		{Device: "d2", Conn: "c", ID: "f", Index: 0, Count: 1, Data: []byte("a")}, // completes
		{Device: "d3", Conn: "c", ID: "f", Index: 0, Count: 2, Data: []byte("a")}, // then too big
		{Device: "d3", Conn: "c", ID: "f", Index: 1, Count: 2, Data: make([]byte, 10)},
		{Device: "d4", Conn: "c", ID: "f", Index: 0, Count: 2, Data: make([]byte, 11)}, // too big
		{Device: "d5", Conn: "c", ID: "f", Index: 2, Count: 2},                         // mismatch
	}
	for _, p := range parts {
		s.PutPart(ctx, p, lim)
	}
	if err := s.DropUploads(ctx, "d1", "c"); err != nil {
		t.Fatal(err)
	}
	s.uploads.mu.Lock()
	n := len(s.uploads.devices)
	s.uploads.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d devices without open uploads still have an entry", n)
	}
}

func TestNonPositiveTTL(t *testing.T) {
	s := newStore(t, Options{})
	ctx := t.Context()
	for name, call := range map[string]func() error{
		"Claim":          func() error { _, err := s.Claim(ctx, "k", "a", 0); return err },
		"ClaimDevice":    func() error { _, err := s.ClaimDevice(ctx, "d", "e", -time.Second); return err },
		"RefreshDevices": func() error { _, err := s.RefreshDevices(ctx, nil, 0); return err },
		"PushOutbox": func() error {
			_, err := s.PushOutbox(ctx, "d", nil, store.OutboxLimits{MaxItems: 1, TTL: 0})
			return err
		},
		"PutBlob": func() error { _, err := s.PutBlob(ctx, nil, 0); return err },
	} {
		if err := call(); !errors.Is(err, errBadTTL) {
			t.Errorf("%s with ttl <= 0 = %v, want errBadTTL", name, err)
		}
	}
	if ok, _ := s.Seen(ctx, "k"); ok {
		t.Error("Claim with ttl 0 recorded its key")
	}
}

func TestClose(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	s := New(Options{SweepInterval: time.Millisecond, Clock: clk})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-s.swept:
	default:
		t.Fatal("sweeper still running after Close")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The store still answers, expiring lazily.
	ok, err := s.Claim(t.Context(), "k", "a", time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("Claim after Close = %v, %v", ok, err)
	}
	clk.Advance(time.Millisecond)
	if ok, _ := s.Seen(t.Context(), "k"); ok {
		t.Fatal("key not expired lazily after Close")
	}
}

// TestLazyExpiry checks that every concern expires items on access, without
// the sweeper.
func TestLazyExpiry(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	s := newStore(t, Options{SweepInterval: time.Hour, Clock: clk})
	ctx := t.Context()
	const ttl = 30 * time.Millisecond
	if _, err := s.Claim(ctx, "k", "a", ttl); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimDevice(ctx, "d", "edge", ttl); err != nil {
		t.Fatal(err)
	}
	key, err := s.PutBlob(ctx, []byte("blob"), ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PushOutbox(ctx, "d", []byte("a"), store.OutboxLimits{MaxItems: 10, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PushOutbox(ctx, "d", []byte("b"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PushOutbox(ctx, "e", []byte("a"), store.OutboxLimits{MaxItems: 10, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutPrompt(ctx, store.PromptRecord{ID: "p", Device: "d", Expires: clk.Now().Add(ttl)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(ttl)

	if ok, err := s.Seen(ctx, "k"); ok || err != nil {
		t.Errorf("Seen(expired key) = %v, %v", ok, err)
	}
	if _, err := s.DeviceOwner(ctx, "d"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeviceOwner(expired) = %v, want ErrNotFound", err)
	}
	if _, err := s.GetBlob(ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetBlob(expired) = %v, want ErrNotFound", err)
	}
	if _, err := s.TakePrompt(ctx, "p", "d"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("TakePrompt(expired) = %v, want ErrNotFound", err)
	}
	if items, err := s.PeekOutbox(ctx, "e", 0); len(items) != 0 || err != nil {
		t.Errorf("PeekOutbox(expired) = %v, %v", items, err)
	}
	// A push drops the expired items in front of the new one.
	if _, err := s.PushOutbox(ctx, "d", []byte("c"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	s.outbox.mu.Lock()
	n := len(s.outbox.byDevice["d"].items)
	s.outbox.mu.Unlock()
	if n != 2 {
		t.Errorf("outbox holds %d items after a push behind [expired, live], want 2", n)
	}
	if items, err := s.PeekOutbox(ctx, "d", 0); len(items) != 2 || string(items[0].Data)+string(items[1].Data) != "bc" || err != nil {
		t.Errorf("PeekOutbox = %v, %v; want [b c]", items, err)
	}
	if s.dedup.len() != 0 || s.owners.len() != 0 || s.blobs.size() != 0 {
		t.Errorf("expired items kept: %d keys, %d owners, %d blob bytes", s.dedup.len(), s.owners.len(), s.blobs.size())
	}
}

// TestOutboxStoreBound: the store-wide outbox bound at its boundary.
func TestOutboxStoreBound(t *testing.T) {
	s := New(Options{})
	t.Cleanup(func() { s.Close() })
	storetest.OutboxStoreBound(t, s, storetest.Pool{})
}

// TestOutboxShareBound: the per-share outbox bound at its boundary.
func TestOutboxShareBound(t *testing.T) {
	s := New(Options{})
	t.Cleanup(func() { s.Close() })
	storetest.OutboxShareBound(t, s, storetest.Pool{})
}

// TestOutboxStoreShares: the level above the devices of the store-wide
// outbox bound.
func TestOutboxStoreShares(t *testing.T) {
	s := New(Options{})
	t.Cleanup(func() { s.Close() })
	storetest.OutboxStoreShares(t, s, storetest.Pool{})
}
