package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var outboxTests = []test{
	{"Order", testOutboxOrder},
	{"PeekUnknown", testOutboxPeekUnknown},
	{"PeekAfter", testOutboxPeekAfter},
	{"UnackedStay", testOutboxUnackedStay},
	{"AckKeepsLaterPushes", testOutboxAckKeepsLaterPushes},
	{"AckAfterMaxDrops", testOutboxAckAfterMaxDrops},
	{"SeqGrowsAfterEmpty", testOutboxSeqGrowsAfterEmpty},
	{"AckFencedByEpoch", testOutboxAckFencedByEpoch},
	{"MaxDropsOldest", testOutboxMaxDropsOldest},
	{"TTL", testOutboxTTL},
	{"DevicesIndependent", testOutboxDevicesIndependent},
	{"ItemsCopied", testOutboxItemsCopied},
	{"ConcurrentPush", testOutboxConcurrentPush},
	{"ConcurrentPushAndAck", testOutboxConcurrentPushAndAck},
}

func push(t *testing.T, s store.Store, device, item string, max int, ttl time.Duration) {
	t.Helper()
	if _, err := s.PushOutbox(t.Context(), device, []byte(item), store.OutboxLimits{MaxItems: max, TTL: ttl}); err != nil {
		t.Fatalf("PushOutbox(%q): %v", item, err)
	}
}

// peek returns device's items after seq, checking that their Seqs grow.
func peek(t *testing.T, s store.Store, device string, after int64) []store.OutboxItem {
	t.Helper()
	items, err := s.PeekOutbox(t.Context(), device, after)
	if err != nil {
		t.Fatalf("PeekOutbox: %v", err)
	}
	last := after
	for _, it := range items {
		if it.Seq <= last {
			t.Fatalf("PeekOutbox(after %d) returned Seq %d after %d", after, it.Seq, last)
		}
		last = it.Seq
	}
	return items
}

func itemData(items []store.OutboxItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = string(it.Data)
	}
	return out
}

// seqOf returns the Seq of the item whose data is data.
func seqOf(t *testing.T, items []store.OutboxItem, data string) int64 {
	t.Helper()
	for _, it := range items {
		if string(it.Data) == data {
			return it.Seq
		}
	}
	t.Fatalf("no item %q in %q", data, itemData(items))
	return 0
}

func wantOutbox(t *testing.T, s store.Store, device string, want ...string) {
	t.Helper()
	if got := itemData(peek(t, s, device, 0)); !slices.Equal(got, want) {
		t.Fatalf("PeekOutbox = %q, want %q", got, want)
	}
}

func ack(t *testing.T, s store.Store, device string, epoch, upTo int64, want bool) {
	t.Helper()
	ok, err := s.AckOutbox(t.Context(), device, epoch, upTo)
	if err != nil {
		t.Fatalf("AckOutbox: %v", err)
	}
	if ok != want {
		t.Fatalf("AckOutbox(epoch %d, up to %d) = %v, want %v", epoch, upTo, ok, want)
	}
}

func testOutboxOrder(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	for _, it := range []string{"a", "b", "c"} {
		push(t, s, dev, it, 10, time.Minute)
	}
	wantOutbox(t, s, dev, "a", "b", "c")
	wantOutbox(t, s, dev, "a", "b", "c") // a peek leaves them
}

func testOutboxPeekUnknown(t *testing.T, s store.Store) {
	wantOutbox(t, s, name(t, "dev"))
}

func testOutboxPeekAfter(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	for _, it := range []string{"a", "b", "c"} {
		push(t, s, dev, it, 10, time.Minute)
	}
	all := peek(t, s, dev, 0)
	if got := itemData(peek(t, s, dev, seqOf(t, all, "a"))); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("after a: %q, want [b c]", got)
	}
	if got := peek(t, s, dev, seqOf(t, all, "c")); len(got) != 0 {
		t.Fatalf("after c: %q, want none", itemData(got))
	}
}

// testOutboxUnackedStay: a reader that never acknowledges (its socket died
// mid-flush) leaves every item for the next reader.
func testOutboxUnackedStay(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	claimDevice(t, s, dev, "edge-1", time.Minute)
	push(t, s, dev, "a", 10, time.Minute)
	push(t, s, dev, "b", 10, time.Minute)
	peek(t, s, dev, 0)
	epoch := claimDevice(t, s, dev, "edge-2", time.Minute) // the reconnect
	wantOutbox(t, s, dev, "a", "b")
	ack(t, s, dev, epoch, seqOf(t, peek(t, s, dev, 0), "b"), true)
	wantOutbox(t, s, dev)
}

// testOutboxAckKeepsLaterPushes: items pushed between the peek and the ack
// stay.
func testOutboxAckKeepsLaterPushes(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	epoch := claimDevice(t, s, dev, "edge-1", time.Minute)
	push(t, s, dev, "a", 10, time.Minute)
	push(t, s, dev, "b", 10, time.Minute)
	read := peek(t, s, dev, 0)
	push(t, s, dev, "c", 10, time.Minute)
	ack(t, s, dev, epoch, read[len(read)-1].Seq, true)
	wantOutbox(t, s, dev, "c")
	// Acknowledging the first item only leaves the second.
	push(t, s, dev, "d", 10, time.Minute)
	read = peek(t, s, dev, 0)
	ack(t, s, dev, epoch, seqOf(t, read, "c"), true)
	wantOutbox(t, s, dev, "d")
}

// testOutboxAckAfterMaxDrops: the max-length bound dropped items between
// the peek and the ack; the ack removes what is left of the read items and
// nothing pushed later.
func testOutboxAckAfterMaxDrops(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	epoch := claimDevice(t, s, dev, "edge-1", time.Minute)
	for _, it := range []string{"1", "2", "3"} {
		push(t, s, dev, it, 3, time.Minute)
	}
	read := peek(t, s, dev, 0)
	push(t, s, dev, "4", 3, time.Minute) // drops 1
	push(t, s, dev, "5", 3, time.Minute) // drops 2
	ack(t, s, dev, epoch, read[len(read)-1].Seq, true)
	wantOutbox(t, s, dev, "4", "5")

	// Every read item was dropped: the ack removes nothing.
	read = peek(t, s, dev, 0)
	for _, it := range []string{"6", "7", "8"} {
		push(t, s, dev, it, 3, time.Minute)
	}
	ack(t, s, dev, epoch, read[len(read)-1].Seq, true)
	wantOutbox(t, s, dev, "6", "7", "8")
}

// testOutboxSeqGrowsAfterEmpty: once an ack empties the outbox, later items
// still get greater Seqs, so a late repeat of the ack cannot remove them.
func testOutboxSeqGrowsAfterEmpty(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	epoch := claimDevice(t, s, dev, "edge-1", time.Minute)
	push(t, s, dev, "a", 10, time.Minute)
	first := peek(t, s, dev, 0)[0].Seq
	ack(t, s, dev, epoch, first, true)
	wantOutbox(t, s, dev)
	push(t, s, dev, "b", 10, time.Minute)
	if next := peek(t, s, dev, 0)[0].Seq; next <= first {
		t.Fatalf("Seq after the outbox was emptied: %d, want more than %d", next, first)
	}
	ack(t, s, dev, epoch, first, true)
	wantOutbox(t, s, dev, "b")
}

// testOutboxAckFencedByEpoch: the ack of a replaced connection, or of one
// whose owner record is gone, removes nothing; the owner's ack does.
func testOutboxAckFencedByEpoch(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	old := claimDevice(t, s, dev, "edge-1", time.Minute)
	push(t, s, dev, "a", 10, time.Minute)
	read := peek(t, s, dev, 0)
	cur := claimDevice(t, s, dev, "edge-2", time.Minute)
	ack(t, s, dev, old, read[0].Seq, false)
	wantOutbox(t, s, dev, "a")
	ack(t, s, dev, cur+1, read[0].Seq, false) // an epoch never handed out
	wantOutbox(t, s, dev, "a")
	releaseDevice(t, s, dev, cur)
	ack(t, s, dev, cur, read[0].Seq, false)
	wantOutbox(t, s, dev, "a")
	cur = claimDevice(t, s, dev, "edge-2", time.Minute)
	ack(t, s, dev, cur, read[0].Seq, true)
	wantOutbox(t, s, dev)
	// The owner of a device without an outbox may acknowledge too.
	ack(t, s, dev, cur, read[0].Seq, true)
}

func testOutboxMaxDropsOldest(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	for i := 1; i <= 5; i++ {
		push(t, s, dev, fmt.Sprint(i), 3, time.Minute)
	}
	wantOutbox(t, s, dev, "3", "4", "5")
}

// testOutboxTTL forgets each item ttl after its push, whether or not newer
// items follow it, and whether or not it was read.
func testOutboxTTL(t *testing.T, s store.Store) {
	const ttl = 2 * time.Second
	mixed, gone, later := name(t, "mixed"), name(t, "gone"), name(t, "later")
	t0 := time.Now()
	push(t, s, mixed, "old", 10, ttl)
	push(t, s, gone, "old", 10, ttl)
	push(t, s, later, "old", 10, ttl)
	wantOutbox(t, s, gone, "old")
	time.Sleep(time.Until(t0.Add(time.Second))) // the TTL under test, on the store's clock
	push(t, s, mixed, "fresh", 10, ttl)
	time.Sleep(time.Until(t0.Add(ttl + 400*time.Millisecond))) // idem
	wantOutbox(t, s, mixed, "fresh")                           // old is 2.4 s old, fresh 1.4 s
	wantOutbox(t, s, gone)
	push(t, s, later, "new", 10, ttl)
	wantOutbox(t, s, later, "new")
}

func testOutboxDevicesIndependent(t *testing.T, s store.Store) {
	d1, d2 := name(t, "dev1"), name(t, "dev2")
	e1 := claimDevice(t, s, d1, "edge-1", time.Minute)
	push(t, s, d1, "1a", 2, time.Minute)
	push(t, s, d2, "2a", 2, time.Minute)
	push(t, s, d1, "1b", 2, time.Minute)
	push(t, s, d1, "1c", 2, time.Minute)
	wantOutbox(t, s, d1, "1b", "1c")
	wantOutbox(t, s, d2, "2a")
	ack(t, s, d1, e1, 1<<62, true)
	wantOutbox(t, s, d1)
	wantOutbox(t, s, d2, "2a")
}

func testOutboxItemsCopied(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	item := []byte("frame")
	if _, err := s.PushOutbox(t.Context(), dev, item, store.OutboxLimits{MaxItems: 10, TTL: time.Minute}); err != nil {
		t.Fatalf("PushOutbox: %v", err)
	}
	copy(item, "XXXXX")
	copy(peek(t, s, dev, 0)[0].Data, "YYYYY")
	wantOutbox(t, s, dev, "frame")
}

// testOutboxConcurrentPush races writers: nothing is lost and each writer's
// items keep their order.
func testOutboxConcurrentPush(t *testing.T, s store.Store) {
	const writers, each = 8, 20
	dev := name(t, "dev")
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := s.PushOutbox(t.Context(), dev, fmt.Appendf(nil, "%d/%d", w, i), store.OutboxLimits{MaxItems: 1000, TTL: time.Minute}); err != nil {
					t.Errorf("PushOutbox: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	items := itemData(peek(t, s, dev, 0))
	if len(items) != writers*each {
		t.Fatalf("PeekOutbox returned %d items, want %d", len(items), writers*each)
	}
	wantWriterOrder(t, items, writers)
}

// testOutboxConcurrentPushAndAck races writers with a reader that peeks
// after what it read and acknowledges it: the reader gets every item once
// and in order, so no ack removed an item it had not read.
func testOutboxConcurrentPushAndAck(t *testing.T, s store.Store) {
	const writers, each = 4, 25
	dev := name(t, "dev")
	epoch := claimDevice(t, s, dev, "edge-1", time.Minute)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := s.PushOutbox(t.Context(), dev, fmt.Appendf(nil, "%d/%d", w, i), store.OutboxLimits{MaxItems: 1000, TTL: time.Minute}); err != nil {
					t.Errorf("PushOutbox: %v", err)
					return
				}
			}
		})
	}
	pushed := make(chan struct{})
	go func() { wg.Wait(); close(pushed) }()
	var got []string
	var last int64
	for done := false; !done; {
		select {
		case <-pushed:
			done = true // one more round reads the rest
		default:
		}
		items := peek(t, s, dev, last)
		if len(items) == 0 {
			continue
		}
		got = append(got, itemData(items)...)
		last = items[len(items)-1].Seq
		ack(t, s, dev, epoch, last, true)
	}
	if len(got) != writers*each {
		t.Fatalf("the reader got %d items, want %d", len(got), writers*each)
	}
	wantWriterOrder(t, got, writers)
	wantOutbox(t, s, dev)
}

// wantWriterOrder checks that items "<writer>/<i>" of each writer come in
// order, none missing or repeated.
func wantWriterOrder(t *testing.T, items []string, writers int) {
	t.Helper()
	next := make([]int, writers)
	for _, it := range items {
		var w, i int
		if _, err := fmt.Sscanf(it, "%d/%d", &w, &i); err != nil || w < 0 || w >= writers {
			t.Fatalf("unexpected item %q", it)
		}
		if i != next[w] {
			t.Fatalf("writer %d: item %d came where %d was due", w, i, next[w])
		}
		next[w]++
	}
}
