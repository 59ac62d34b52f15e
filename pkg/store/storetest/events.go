package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/store"
)

var eventTests = []test{
	{"Log", testEvents},
}

// testEvents runs its subtests one after another on one store: the event
// log is one per store (one per key prefix in Redis), so subtests running
// at once would read each other's entries. Each subtest still reads only
// after a cursor of its own, or skips entries that are not its own, so a
// log that holds older entries does not fail it.
func testEvents(t *testing.T, s store.Store) {
	t.Run("Order", func(t *testing.T) { testEventsOrder(t, s) })
	t.Run("FromOldest", func(t *testing.T) { testEventsFromOldest(t, s) })
	t.Run("Paging", func(t *testing.T) { testEventsPaging(t, s) })
	t.Run("Copied", func(t *testing.T) { testEventsCopied(t, s) })
	t.Run("NoWait", func(t *testing.T) { testEventsNoWait(t, s) })
	t.Run("WaitTimesOut", func(t *testing.T) { testEventsWaitTimesOut(t, s) })
	t.Run("WaitWakes", func(t *testing.T) { testEventsWaitWakes(t, s) })
	t.Run("WaitBoundedByContext", func(t *testing.T) { testEventsWaitContext(t, s) })
	t.Run("ConcurrentAppend", func(t *testing.T) { testEventsConcurrentAppend(t, s) })
	t.Run("MaxLen", func(t *testing.T) { testEventsMaxLen(t, s) })
	t.Run("BadCursor", func(t *testing.T) { testEventsBadCursor(t, s) })
	t.Run("Canceled", func(t *testing.T) { testEventsCanceled(t, s) })
	t.Run("Logs", func(t *testing.T) { testEventsLogs(t, s) })
}

// testEventsLogs: each log of AppendEventIn is its own: a read of one
// never sees another's entries, "" is AppendEvent's log, and a reader
// waiting on one log is woken by its own appends.
func testEventsLogs(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b := "a"+testsvc.RandomHex(4), "b"+testsvc.RandomHex(4)
	last := mark(t, s)
	ca, err := s.AppendEventIn(ctx, a, []byte("in a"), eventsMax)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEventIn(ctx, b, []byte("in b"), eventsMax); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReadEventsIn(ctx, a, "", 100, 0); err != nil || len(got) != 1 || string(got[0].Data) != "in a" || got[0].Cursor != ca {
		t.Fatalf("log a: %v, %v; want its one entry", got, err)
	}
	if got, err := s.ReadEventsIn(ctx, b, "", 100, 0); err != nil || len(got) != 1 || string(got[0].Data) != "in b" {
		t.Fatalf("log b: %v, %v; want its one entry", got, err)
	}
	if got := readEvents(t, s, last, 100, 0); len(got) != 0 {
		t.Fatalf("the log of AppendEvent holds the others' entries: %v", eventData(got))
	}
	c := appendEvent(t, s, "in the first", eventsMax)
	if got, err := s.ReadEventsIn(ctx, "", last, 100, 0); err != nil || len(got) != 1 || got[0].Cursor != c {
		t.Fatalf(`log "": %v, %v; want AppendEvent's entry`, got, err)
	}
	res := make(chan []store.EventEntry, 1)
	go func() {
		es, _ := s.ReadEventsIn(ctx, a, ca, 10, 10*time.Second)
		res <- es
	}()
	if _, err := s.AppendEventIn(ctx, a, []byte("wake a"), eventsMax); err != nil {
		t.Fatal(err)
	}
	select {
	case es := <-res:
		if len(es) != 1 || string(es[0].Data) != "wake a" {
			t.Fatalf("a reader waiting on log a got %v, want its append", eventData(es))
		}
	case <-time.After(5 * time.Second): // well within the reader's 10 s wait
		t.Fatal("a reader waiting on log a was not woken by its append")
	}
}

// eventsMax is the maxLen of the subtests that do not test trimming.
const eventsMax = 10000

func appendEvent(t *testing.T, s store.Store, data string, maxLen int) string {
	t.Helper()
	c, err := s.AppendEvent(t.Context(), []byte(data), maxLen)
	if err != nil {
		t.Fatalf("AppendEvent(%q): %v", data, err)
	}
	if c == "" {
		t.Fatalf("AppendEvent(%q) returned an empty cursor", data)
	}
	return c
}

func readEvents(t *testing.T, s store.Store, after string, limit int, wait time.Duration) []store.EventEntry {
	t.Helper()
	es, err := s.ReadEvents(t.Context(), after, limit, wait)
	if err != nil {
		t.Fatalf("ReadEvents(%q, %d, %v): %v", after, limit, wait, err)
	}
	if len(es) > max(limit, 1) {
		t.Fatalf("ReadEvents(%q, max %d) returned %d entries", after, limit, len(es))
	}
	return es
}

// eventData returns the data of es as strings.
func eventData(es []store.EventEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = string(e.Data)
	}
	return out
}

// mark appends an entry and returns its cursor: what a subtest appends
// after it is what it reads after it.
func mark(t *testing.T, s store.Store) string {
	t.Helper()
	return appendEvent(t, s, name(t, "mark"), eventsMax)
}

// readAll reads every entry after after, in pages of page.
func readAll(t *testing.T, s store.Store, after string, page int) []store.EventEntry {
	t.Helper()
	var all []store.EventEntry
	for range 100000 {
		es := readEvents(t, s, after, page, 0)
		if len(es) == 0 {
			return all
		}
		all = append(all, es...)
		after = es[len(es)-1].Cursor
	}
	t.Fatal("ReadEvents never ran dry")
	return nil
}

func testEventsOrder(t *testing.T, s store.Store) {
	start := mark(t, s)
	var cursors []string
	want := []string{"a", "b", "c", ""}
	for _, d := range want {
		cursors = append(cursors, appendEvent(t, s, d, eventsMax))
	}
	got := readEvents(t, s, start, 100, 0)
	if !slices.Equal(eventData(got), want) {
		t.Fatalf("ReadEvents after the mark = %q, want %q", eventData(got), want)
	}
	seen := map[string]bool{start: true}
	for i, e := range got {
		if e.Cursor != cursors[i] {
			t.Fatalf("entry %d has cursor %q, AppendEvent returned %q", i, e.Cursor, cursors[i])
		}
		if seen[e.Cursor] {
			t.Fatalf("cursor %q handed out twice", e.Cursor)
		}
		seen[e.Cursor] = true
	}
	// Strictly after: each cursor gives the entries that follow it.
	for i, c := range cursors {
		if got := eventData(readEvents(t, s, c, 100, 0)); !slices.Equal(got, want[i+1:]) {
			t.Fatalf("ReadEvents after entry %d = %q, want %q", i, got, want[i+1:])
		}
	}
}

// testEventsFromOldest: after "" reads from the oldest entry retained, so
// the entries just appended come last, in order.
func testEventsFromOldest(t *testing.T, s store.Store) {
	want := []string{name(t, "1"), name(t, "2"), name(t, "3")}
	for _, d := range want {
		appendEvent(t, s, d, eventsMax)
	}
	all := eventData(readAll(t, s, "", 1000))
	if len(all) < len(want) || !slices.Equal(all[len(all)-len(want):], want) {
		t.Fatalf("ReadEvents from the oldest ends with %q, want %q", all[max(0, len(all)-len(want)):], want)
	}
	first := readEvents(t, s, "", 1, 0)
	if len(first) != 1 || first[0].Cursor != readAll(t, s, "", 1000)[0].Cursor {
		t.Fatalf("ReadEvents(\"\", max 1) = %v, want the oldest entry", first)
	}
}

// testEventsPaging reads in pages with the last cursor of each: nothing is
// lost or repeated.
func testEventsPaging(t *testing.T, s store.Store) {
	start := mark(t, s)
	var want []string
	for i := range 25 {
		d := fmt.Sprint(i)
		want = append(want, d)
		appendEvent(t, s, d, eventsMax)
	}
	for _, page := range []int{1, 3, 7, 25, 100} {
		if got := eventData(readAll(t, s, start, page)); !slices.Equal(got, want) {
			t.Fatalf("pages of %d = %q, want %q", page, got, want)
		}
	}
	if got := readEvents(t, s, start, 0, 0); len(got) != 1 || string(got[0].Data) != "0" {
		t.Fatalf("ReadEvents(max 0) = %q, want the one next entry", eventData(got))
	}
}

func testEventsCopied(t *testing.T, s store.Store) {
	start := mark(t, s)
	data := []byte("event")
	if _, err := s.AppendEvent(t.Context(), data, eventsMax); err != nil {
		t.Fatal(err)
	}
	copy(data, "XXXXX")
	got := readEvents(t, s, start, 10, 0)
	if len(got) != 1 || string(got[0].Data) != "event" {
		t.Fatalf("ReadEvents = %q, want the bytes as appended", eventData(got))
	}
	copy(got[0].Data, "YYYYY")
	if got := readEvents(t, s, start, 10, 0); len(got) != 1 || string(got[0].Data) != "event" {
		t.Fatalf("ReadEvents after changing a returned entry = %q", eventData(got))
	}
}

func testEventsNoWait(t *testing.T, s store.Store) {
	last := mark(t, s)
	begin := time.Now()
	if got := readEvents(t, s, last, 10, 0); len(got) != 0 {
		t.Fatalf("ReadEvents after the last entry = %q, want none", eventData(got))
	}
	if d := time.Since(begin); d > time.Second {
		t.Fatalf("ReadEvents with wait 0 took %v", d)
	}
}

func testEventsWaitTimesOut(t *testing.T, s store.Store) {
	last := mark(t, s)
	const wait = 300 * time.Millisecond
	begin := time.Now()
	got, err := s.ReadEvents(t.Context(), last, 10, wait)
	took := time.Since(begin)
	if err != nil || len(got) != 0 {
		t.Fatalf("ReadEvents with nothing to read = %q, %v; want none and no error", eventData(got), err)
	}
	if took < wait-50*time.Millisecond || took > wait+time.Second {
		t.Fatalf("ReadEvents(wait %v) returned after %v", wait, took)
	}
}

// testEventsWaitWakes: a reader waiting for entries gets one as soon as it
// is appended, long before its wait ends.
func testEventsWaitWakes(t *testing.T, s store.Store) {
	last := mark(t, s)
	type result struct {
		es   []store.EventEntry
		err  error
		took time.Duration
	}
	res := make(chan result, 1)
	begin := time.Now()
	go func() {
		es, err := s.ReadEvents(t.Context(), last, 10, 10*time.Second)
		res <- result{es, err, time.Since(begin)}
	}()
	// Nothing outside a store shows that a reader is blocked; an append
	// before it blocks passes the same checks, so this pause only makes the
	// wake-up path the likely one, it is not what the test waits for.
	time.Sleep(200 * time.Millisecond)
	c := appendEvent(t, s, "wake", eventsMax)
	select {
	case r := <-res:
		if r.err != nil || len(r.es) != 1 || string(r.es[0].Data) != "wake" || r.es[0].Cursor != c {
			t.Fatalf("waiting ReadEvents = %v, %v; want the appended entry", r.es, r.err)
		}
		if r.took > testsvc.Slack(3*time.Second) {
			t.Fatalf("waiting ReadEvents returned %v after it began, want soon after the append", r.took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting ReadEvents did not return within 5 s of an append")
	}
}

// testEventsWaitContext: a context deadline shorter than the wait ends the
// wait at about the deadline, with nothing or with the context's error, but
// not with a failure of the backend.
func testEventsWaitContext(t *testing.T, s store.Store) {
	last := mark(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
	defer cancel()
	begin := time.Now()
	got, err := s.ReadEvents(ctx, last, 10, 10*time.Second)
	took := time.Since(begin)
	switch {
	case err == nil && len(got) == 0:
	case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, store.ErrUnavailable):
	default:
		t.Fatalf("ReadEvents(wait 10s) with a 400ms context = %q, %v; want none, or only context.DeadlineExceeded", eventData(got), err)
	}
	if took > testsvc.Slack(1500*time.Millisecond) {
		t.Fatalf("ReadEvents with a 400ms context took %v", took)
	}
}

// testEventsConcurrentAppend races writers and a waiting reader: every
// entry is read once, each writer's in its order.
func testEventsConcurrentAppend(t *testing.T, s store.Store) {
	const writers, each = 8, 25
	start := mark(t, s)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := s.AppendEvent(t.Context(), fmt.Appendf(nil, "%d/%d", w, i), eventsMax); err != nil {
					t.Errorf("AppendEvent: %v", err)
					return
				}
			}
		})
	}
	// Read while they write, waiting for what is not there yet.
	var got []string
	after := start
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < writers*each && time.Now().Before(deadline) {
		es := readEvents(t, s, after, 7, time.Second)
		for _, e := range es {
			got = append(got, string(e.Data))
			after = e.Cursor
		}
	}
	wg.Wait()
	got = append(got, eventData(readAll(t, s, after, 100))...)
	if len(got) != writers*each {
		t.Fatalf("read %d entries, want %d", len(got), writers*each)
	}
	next := make([]int, writers)
	for _, d := range got {
		var w, i int
		if _, err := fmt.Sscanf(d, "%d/%d", &w, &i); err != nil || w < 0 || w >= writers {
			t.Fatalf("unexpected entry %q", d)
		}
		if i != next[w] {
			t.Fatalf("writer %d: entry %d came where %d was due", w, i, next[w])
		}
		next[w]++
	}
}

// testEventsMaxLen appends far more than maxLen entries: the oldest are
// dropped, at least the newest maxLen are kept, in order, and reading
// after a dropped cursor goes on from the oldest entry kept.
func testEventsMaxLen(t *testing.T, s store.Store) {
	const maxLen, n = 10, 500
	first := appendEvent(t, s, name(t, "0"), maxLen)
	want := []string{name(t, "0")}
	for i := 1; i < n; i++ {
		d := name(t, fmt.Sprint(i))
		want = append(want, d)
		appendEvent(t, s, d, maxLen)
	}
	all := eventData(readAll(t, s, "", 100))
	if len(all) < maxLen || len(all) > n/2 {
		t.Fatalf("after %d appends with maxLen %d the log holds %d entries, want at least %d and about %d",
			n, maxLen, len(all), maxLen, maxLen)
	}
	// Only our own entries are left, a suffix of what was appended.
	if !slices.Equal(all, want[n-len(all):]) {
		t.Fatalf("the log holds %q…, want the newest %d of %q…", all[:3], len(all), want[:3])
	}
	if got := eventData(readAll(t, s, first, 100)); !slices.Equal(got, all) {
		t.Fatalf("ReadEvents after a dropped cursor = %d entries, want the %d kept", len(got), len(all))
	}
	if strings.Contains(strings.Join(all, "\n"), name(t, "0")+"\n") {
		t.Fatal("the oldest entry was kept")
	}
}

func testEventsBadCursor(t *testing.T, s store.Store) {
	for _, c := range []string{"nonsense", "$", "+", "-", "12", "12-", "-3", "1-2-3", "a-1", "1-b", "-1-2", "99999999999999999999-0"} {
		if _, err := s.ReadEvents(t.Context(), c, 10, 0); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("ReadEvents(%q) = %v, want ErrBadCursor", c, err)
		}
	}
	if _, err := s.AppendEvent(t.Context(), []byte("x"), 0); err == nil {
		t.Error("AppendEvent with maxLen 0 succeeded")
	}
}

func testEventsCanceled(t *testing.T, s store.Store) {
	last := mark(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.AppendEvent(ctx, []byte("x"), eventsMax); !errors.Is(err, context.Canceled) {
		t.Errorf("AppendEvent with a canceled context = %v, want context.Canceled", err)
	}
	if _, err := s.ReadEvents(ctx, last, 10, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadEvents with a canceled context = %v, want context.Canceled", err)
	}
	if got := readEvents(t, s, last, 10, 0); len(got) != 0 {
		t.Errorf("a canceled AppendEvent appended %q", eventData(got))
	}
}
