package memstore

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// outboxShape is a way to fill the outboxes: items of size bytes, perDevice
// of them in each device, charged in turn to shares shares.
type outboxShape struct {
	size, perDevice, shares int
}

var outboxShapes = []outboxShape{
	{1, 1, 1},         // the worst: a made-up device per 1-byte item
	{1, 1000, 1},      // tiny items, few devices
	{100, 1, 3},       // short texts, one per device
	{100, 10, 3},      // the review's flood: 10 short answers per device
	{300, 1000, 1},    // agent answers to sleeping phones
	{1000, 10, 3},     // longer answers
	{5000, 1, 1},      // cards
	{40 << 10, 10, 3}, // long texts
	{64 << 10, 1, 1},  // a large allocation (past the size classes)
}

// poolHeap fills s's outboxes with items of shape until they have been
// full for as long again (twice what fits is pushed) and returns the live
// heap they take after a collection, the bytes of the items kept and how
// many.
func poolHeap(t testing.TB, s *Store, sh outboxShape, bound int64) (heapBytes, itemBytes int64, items int) {
	item := make([]byte, sh.size)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := int64(ms.HeapAlloc)
	lim := store.OutboxLimits{MaxItems: 1 << 20, TTL: time.Hour}
	n := int(2*bound/(int64(sh.size)+itemOverhead)) + 1
	for i := range n {
		lim.Share = fmt.Sprintf("share-%d", i%sh.shares)
		if _, err := s.PushOutbox(t.Context(), fmt.Sprintf("device-%08d", i/sh.perDevice), item, lim); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heapBytes = int64(ms.HeapAlloc) - before
	s.outbox.mu.Lock()
	defer s.outbox.mu.Unlock()
	return heapBytes, s.outbox.bytes, s.outbox.byDeadline.h.Len()
}

// TestOutboxCostMatchesHeap fills the outboxes to Options.MaxOutboxBytes
// in shapes from a made-up device per 1-byte item to 64 KiB items, and
// measures the live heap they take: within 10 % of the bound (a few
// percent, measured), where the items' lengths alone (what MaxStoreBytes
// counts, and all the store counted before) are 370 times less than the
// heap for 1-byte items, one per device, and 4.7 times less for 100-byte
// ones.
func TestOutboxCostMatchesHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 16 MiB nine times")
	}
	const bound = 16 << 20
	for _, sh := range outboxShapes {
		s := newStore(t, Options{MaxOutboxBytes: bound})
		heapBytes, itemBytes, items := poolHeap(t, s, sh, bound)
		ratio := float64(heapBytes) / bound
		t.Logf("%5d-byte items, %4d per device, %d shares: %d items, heap %.2f MiB = %.3f of the bound; heap / the items' lengths %.2f",
			sh.size, sh.perDevice, sh.shares, items, float64(heapBytes)/(1<<20), ratio, float64(heapBytes)/float64(itemBytes))
		if ratio > 1.10 || ratio < 0.80 {
			t.Errorf("%+v: the full outboxes take %.3f of their bound in heap, want 0.80 to 1.10", sh, ratio)
		}
		s.Close()
	}
}

// BenchmarkOutboxFullPool fills a pool of the default bound (or
// MOBILE_MAX_OUTBOX_MIB's 1 GiB, through MaxOutboxBytes) and reports what a
// full pool takes: the live heap and the heap the runtime took from the
// system (the peak, which the collector's headroom makes larger), each
// per byte of the bound.
//
//	go test -run '^$' -bench OutboxFullPool -benchtime 1x ./pkg/store/memstore/
func BenchmarkOutboxFullPool(b *testing.B) {
	for _, sh := range []outboxShape{{100, 10, 3}, {300, 1000, 1}} {
		b.Run(fmt.Sprintf("%dB-x%d", sh.size, sh.perDevice), func(b *testing.B) {
			for range b.N {
				s := New(Options{})
				bound := s.outbox.maxCost
				heapBytes, _, _ := poolHeap(b, s, sh, bound)
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(bound)/(1<<20), "bound-MiB")
				b.ReportMetric(float64(heapBytes)/float64(bound), "live/bound")
				b.ReportMetric(float64(ms.HeapSys)/float64(bound), "heapsys/bound")
				s.Close()
			}
		})
	}
}

func TestDefaultMaxOutboxBytes(t *testing.T) {
	for _, c := range []struct{ avail, want int64 }{
		{0, 256 << 20},       // unknown
		{64 << 20, 16 << 20}, // at least 16 MiB
		{1 << 30, 128 << 20}, // an eighth
		{4 << 30, 512 << 20},
		{64 << 30, 1 << 30}, // at most 1 GiB
	} {
		if got := outboxBytesFor(c.avail); got != c.want {
			t.Errorf("outboxBytesFor(%d MiB) = %d MiB, want %d MiB", c.avail>>20, got>>20, c.want>>20)
		}
	}
	if d := DefaultMaxOutboxBytes(); d < 16<<20 || d > 1<<30 {
		t.Errorf("DefaultMaxOutboxBytes() = %d", d)
	}
	if s := newStore(t, Options{}); s.outbox.maxCost != DefaultMaxOutboxBytes() {
		t.Errorf("the zero Options bound the outboxes by %d, want DefaultMaxOutboxBytes()", s.outbox.maxCost)
	}
	if s := newStore(t, Options{MaxOutboxBytes: -1}); s.outbox.maxCost != 0 {
		t.Errorf("MaxOutboxBytes -1 bounds the outboxes by %d, want no bound", s.outbox.maxCost)
	}
}

// TestCgroupLimit reads the least limit of the process's cgroup and its
// parents, on cgroup v2 and v1, where "max" and v1's huge number are none.
func TestCgroupLimit(t *testing.T) {
	mount := t.TempDir()
	write := func(file, content string) {
		t.Helper()
		p := filepath.Join(mount, file)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("memory.max", "max\n")
	write("kubepods/memory.max", "2147483648\n")
	write("kubepods/pod1/memory.max", "max\n")
	write("memory/memory.limit_in_bytes", "9223372036854771712\n")
	write("memory/docker/abc/memory.limit_in_bytes", "536870912\n")
	for _, c := range []struct {
		proc string
		want int64
	}{
		{"0::/kubepods/pod1\n", 2 << 30},
		{"0::/\n", 0},
		{"4:memory:/docker/abc\n3:cpu:/\n", 512 << 20},
		{"4:cpuacct,memory:/docker/abc\n", 512 << 20},
		{"4:memory:/elsewhere\n", 0},
		{"garbage", 0},
	} {
		if got := cgroupLimit([]byte(c.proc), mount); got != c.want {
			t.Errorf("cgroupLimit(%q) = %d, want %d", c.proc, got, c.want)
		}
	}
}
