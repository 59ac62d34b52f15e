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

var historyTests = []test{
	{"Order", testHistoryOrder},
	{"Unknown", testHistoryUnknown},
	{"MaxItems", testHistoryMaxItems},
	{"MaxBytes", testHistoryMaxBytes},
	{"ItemOverMaxBytes", testHistoryItemOverMaxBytes},
	{"NoRoom", testHistoryNoRoom},
	{"TTL", testHistoryTTL},
	{"SessionsIndependent", testHistorySessionsIndependent},
	{"ItemsCopied", testHistoryItemsCopied},
	{"ConcurrentAppend", testHistoryConcurrentAppend},
	{"BadTTL", testHistoryBadTTL},
}

// roomyHistory keeps everything the tests append unless they say otherwise.
var roomyHistory = store.HistoryLimits{MaxItems: 1000, MaxBytes: 1 << 20, TTL: time.Minute}

func appendHistory(t *testing.T, s store.Store, session string, lim store.HistoryLimits, items ...string) {
	t.Helper()
	b := make([][]byte, len(items))
	for i, it := range items {
		b[i] = []byte(it)
	}
	if err := s.AppendHistory(t.Context(), session, b, lim); err != nil {
		t.Fatalf("AppendHistory(%q): %v", items, err)
	}
}

func getHistory(t *testing.T, s store.Store, session string) []string {
	t.Helper()
	items, err := s.History(t.Context(), session)
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = string(it)
	}
	return out
}

func wantHistory(t *testing.T, s store.Store, session string, want ...string) {
	t.Helper()
	if got := getHistory(t, s, session); !slices.Equal(got, want) {
		t.Fatalf("History = %q, want %q", got, want)
	}
}

// testHistoryOrder: items come back oldest first, and reading does not
// consume them.
func testHistoryOrder(t *testing.T, s store.Store) {
	ses := name(t, "session")
	appendHistory(t, s, ses, roomyHistory, "u1", "a1")
	appendHistory(t, s, ses, roomyHistory, "u2")
	appendHistory(t, s, ses, roomyHistory, "a2")
	wantHistory(t, s, ses, "u1", "a1", "u2", "a2")
	wantHistory(t, s, ses, "u1", "a1", "u2", "a2")
}

func testHistoryUnknown(t *testing.T, s store.Store) {
	wantHistory(t, s, name(t, "session"))
}

// testHistoryMaxItems keeps exactly MaxItems, the newest.
func testHistoryMaxItems(t *testing.T, s store.Store) {
	ses := name(t, "session")
	lim := roomyHistory
	lim.MaxItems = 3
	appendHistory(t, s, ses, lim, "1", "2", "3")
	wantHistory(t, s, ses, "1", "2", "3")
	appendHistory(t, s, ses, lim, "4")
	wantHistory(t, s, ses, "2", "3", "4")
	appendHistory(t, s, ses, lim, "5", "6", "7", "8")
	wantHistory(t, s, ses, "6", "7", "8")
}

// testHistoryMaxBytes keeps the newest items whose lengths sum to at most
// MaxBytes: exactly MaxBytes stays, one byte more drops the oldest.
func testHistoryMaxBytes(t *testing.T, s store.Store) {
	ses := name(t, "session")
	lim := roomyHistory
	lim.MaxBytes = 10
	appendHistory(t, s, ses, lim, "aaaa", "bbbbbb") // 10 bytes
	wantHistory(t, s, ses, "aaaa", "bbbbbb")
	appendHistory(t, s, ses, lim, "c") // 11: aaaa goes
	wantHistory(t, s, ses, "bbbbbb", "c")
	appendHistory(t, s, ses, lim, "ddd") // 10 again
	wantHistory(t, s, ses, "bbbbbb", "c", "ddd")
	appendHistory(t, s, ses, lim, "eeeeeeeee") // 9: with "ddd" it would be 12
	wantHistory(t, s, ses, "eeeeeeeee")
}

// testHistoryItemOverMaxBytes: an item longer than MaxBytes is never kept,
// and it pushes out everything older.
func testHistoryItemOverMaxBytes(t *testing.T, s store.Store) {
	ses := name(t, "session")
	lim := roomyHistory
	lim.MaxBytes = 10
	appendHistory(t, s, ses, lim, "old")
	appendHistory(t, s, ses, lim, strings.Repeat("x", 11))
	wantHistory(t, s, ses)
	appendHistory(t, s, ses, lim, "new", strings.Repeat("x", 10))
	wantHistory(t, s, ses, strings.Repeat("x", 10))
}

// testHistoryNoRoom: limits below 1 keep nothing and forget what was there.
func testHistoryNoRoom(t *testing.T, s store.Store) {
	ses := name(t, "session")
	appendHistory(t, s, ses, roomyHistory, "a")
	appendHistory(t, s, ses, store.HistoryLimits{MaxItems: 0, MaxBytes: 100, TTL: time.Minute}, "b")
	wantHistory(t, s, ses)
	appendHistory(t, s, ses, roomyHistory, "c")
	appendHistory(t, s, ses, store.HistoryLimits{MaxItems: 10, MaxBytes: 0, TTL: time.Minute}, "d")
	wantHistory(t, s, ses)
}

// testHistoryTTL forgets the whole history TTL after its last append, and an
// append renews the TTL of the older items too.
func testHistoryTTL(t *testing.T, s store.Store) {
	lim := roomyHistory
	lim.TTL = 2 * time.Second
	kept, gone := name(t, "kept"), name(t, "gone")
	t0 := time.Now()
	appendHistory(t, s, kept, lim, "old")
	appendHistory(t, s, gone, lim, "old")
	time.Sleep(time.Until(t0.Add(time.Second))) // the TTL under test, on the store's clock
	appendHistory(t, s, kept, lim, "new")
	time.Sleep(time.Until(t0.Add(2400 * time.Millisecond))) // idem
	wantHistory(t, s, kept, "old", "new")                   // old was appended 2.4 s ago, the last append 1.4 s ago
	eventually(t, expiryWait, "the history is forgotten after its TTL", func() bool {
		return len(getHistory(t, s, gone)) == 0
	})
	eventually(t, expiryWait, "the renewed history is forgotten after its TTL", func() bool {
		return len(getHistory(t, s, kept)) == 0
	})
}

func testHistorySessionsIndependent(t *testing.T, s store.Store) {
	s1, s2 := name(t, "s1"), name(t, "s2")
	lim := roomyHistory
	lim.MaxItems = 2
	appendHistory(t, s, s1, lim, "1a", "1b")
	appendHistory(t, s, s2, lim, "2a")
	appendHistory(t, s, s1, lim, "1c")
	wantHistory(t, s, s1, "1b", "1c")
	wantHistory(t, s, s2, "2a")
}

func testHistoryItemsCopied(t *testing.T, s store.Store) {
	ses := name(t, "session")
	item := []byte("hello")
	if err := s.AppendHistory(t.Context(), ses, [][]byte{item}, roomyHistory); err != nil {
		t.Fatalf("AppendHistory: %v", err)
	}
	copy(item, "XXXXX")
	got, err := s.History(t.Context(), ses)
	if err != nil || len(got) != 1 || string(got[0]) != "hello" {
		t.Fatalf("History = %q, %v; want [hello]", got, err)
	}
	copy(got[0], "YYYYY")
	wantHistory(t, s, ses, "hello")
}

// testHistoryConcurrentAppend races writers appending pairs: nothing is
// lost, each pair stays together and each writer's pairs keep their order.
func testHistoryConcurrentAppend(t *testing.T, s store.Store) {
	const writers, each = 8, 10
	ses := name(t, "session")
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				pair := [][]byte{fmt.Appendf(nil, "%d/%d/q", w, i), fmt.Appendf(nil, "%d/%d/a", w, i)}
				if err := s.AppendHistory(t.Context(), ses, pair, roomyHistory); err != nil {
					t.Errorf("AppendHistory: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	items := getHistory(t, s, ses)
	if len(items) != 2*writers*each {
		t.Fatalf("History holds %d items, want %d", len(items), 2*writers*each)
	}
	next := make([]int, writers)
	for j := 0; j < len(items); j += 2 {
		var w, i int
		if _, err := fmt.Sscanf(items[j], "%d/%d/q", &w, &i); err != nil || w < 0 || w >= writers {
			t.Fatalf("item %d is %q, want a question", j, items[j])
		}
		if want := fmt.Sprintf("%d/%d/a", w, i); items[j+1] != want {
			t.Fatalf("item %d is %q, want %q right after its question", j+1, items[j+1], want)
		}
		if i != next[w] {
			t.Fatalf("writer %d: pair %d came where %d was due", w, i, next[w])
		}
		next[w]++
	}
}

func testHistoryBadTTL(t *testing.T, s store.Store) {
	ses := name(t, "session")
	lim := roomyHistory
	lim.TTL = 0
	if err := s.AppendHistory(t.Context(), ses, [][]byte{[]byte("a")}, lim); err == nil {
		t.Fatal("AppendHistory with a zero TTL succeeded")
	}
	wantHistory(t, s, ses)
}
