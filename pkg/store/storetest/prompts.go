package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var promptTests = []test{
	{"TakeByOwner", testTakeByOwner},
	{"TakeUnknown", testTakeUnknown},
	{"TakeByOtherDevice", testTakeByOtherDevice},
	{"TakeExpiredCard", testTakeExpiredCard},
	{"TakeConcurrent", testTakeConcurrent},
	{"DataCopied", testPromptDataCopied},
	{"TakeExpired", testTakeExpired},
}

// card returns a card for device that expires at expires.
func card(t *testing.T, id, device string, expires time.Time) store.PromptRecord {
	return store.PromptRecord{
		ID:      name(t, id),
		Device:  device,
		Kind:    "clarify",
		Choices: 3,
		Expires: expires,
		Data:    []byte(`{"question":"` + id + `"}`),
	}
}

func putPrompt(t *testing.T, s store.Store, p store.PromptRecord) {
	t.Helper()
	if err := s.PutPrompt(t.Context(), p); err != nil {
		t.Fatalf("PutPrompt(%s): %v", p.ID, err)
	}
}

// wantTake takes card id as device and fails t unless the error is want
// (nil: the card must come back equal to rec).
func wantTake(t *testing.T, s store.Store, rec store.PromptRecord, device string, want error) {
	t.Helper()
	got, err := s.TakePrompt(t.Context(), rec.ID, device)
	if want != nil {
		if !errors.Is(err, want) {
			t.Fatalf("TakePrompt(%s) = %v, want %v", rec.ID, err, want)
		}
		return
	}
	if err != nil {
		t.Fatalf("TakePrompt(%s): %v", rec.ID, err)
	}
	if !samePrompt(got, rec) {
		t.Fatalf("TakePrompt = %+v, want %+v", got, rec)
	}
}

func samePrompt(a, b store.PromptRecord) bool {
	return a.ID == b.ID && a.Device == b.Device && a.Kind == b.Kind && a.Choices == b.Choices &&
		a.Expires.Equal(b.Expires) && bytes.Equal(a.Data, b.Data)
}

func testTakeByOwner(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	p := card(t, "p1", dev, time.Now().Add(time.Hour))
	putPrompt(t, s, p)
	wantTake(t, s, p, dev, nil)
	wantTake(t, s, p, dev, store.ErrNotFound)
}

func testTakeUnknown(t *testing.T, s store.Store) {
	wantTake(t, s, card(t, "nope", name(t, "dev"), time.Time{}), name(t, "dev"), store.ErrNotFound)
}

func testTakeByOtherDevice(t *testing.T, s store.Store) {
	owner, other := name(t, "owner"), name(t, "other")
	p := card(t, "p1", owner, time.Now().Add(time.Hour))
	putPrompt(t, s, p)
	wantTake(t, s, p, other, store.ErrForbidden)
	wantTake(t, s, p, other, store.ErrForbidden) // left in place
	wantTake(t, s, p, owner, nil)
	wantTake(t, s, p, other, store.ErrNotFound)
}

func testTakeExpiredCard(t *testing.T, s store.Store) {
	dev, other := name(t, "dev"), name(t, "other")
	past := card(t, "past", dev, time.Now().Add(-time.Minute))
	putPrompt(t, s, past)
	wantTake(t, s, past, dev, store.ErrNotFound)

	expires := time.Now().Add(time.Second)
	soon := card(t, "soon", dev, expires)
	putPrompt(t, s, soon)
	wantTake(t, s, soon, other, store.ErrForbidden)        // open until expires
	time.Sleep(time.Until(expires) + 100*time.Millisecond) // the card's expiry under test, on the wall clock it was given
	wantTake(t, s, soon, dev, store.ErrNotFound)
}

func testTakeConcurrent(t *testing.T, s store.Store) {
	const n = 16
	dev := name(t, "dev")
	p := card(t, "p1", dev, time.Now().Add(time.Hour))
	putPrompt(t, s, p)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		took int
	)
	for range n {
		wg.Go(func() {
			_, err := s.TakePrompt(t.Context(), p.ID, dev)
			switch {
			case err == nil:
				mu.Lock()
				took++
				mu.Unlock()
			case !errors.Is(err, store.ErrNotFound):
				t.Errorf("TakePrompt: %v", err)
			}
		})
	}
	wg.Wait()
	if took != 1 {
		t.Fatalf("%d concurrent TakePrompt calls got the card, want 1", took)
	}
}

func testPromptDataCopied(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	p := card(t, "p1", dev, time.Now().Add(time.Hour))
	want := bytes.Clone(p.Data)
	putPrompt(t, s, p)
	copy(p.Data, "XXXX")
	p.Data = want
	wantTake(t, s, p, dev, nil)
}

// testTakeExpired runs its subtests one after another: TakeExpired takes the
// expired cards of every user of the backend.
func testTakeExpired(t *testing.T, s store.Store) {
	t.Run("OnlyExpired", func(t *testing.T) { testTakeExpiredOnlyExpired(t, s) })
	t.Run("Max", func(t *testing.T) { testTakeExpiredMax(t, s) })
	t.Run("Concurrent", func(t *testing.T) { testTakeExpiredConcurrent(t, s) })
}

// takeExpired calls TakeExpired(now, max) until it returns nothing and
// returns the cards among them that mine holds, counting each.
func takeExpired(t *testing.T, s store.Store, now time.Time, max int, mine map[string]bool) map[string]int {
	t.Helper()
	got := make(map[string]int)
	for range 10000 {
		recs, err := s.TakeExpired(t.Context(), now, max)
		if err != nil {
			t.Fatalf("TakeExpired: %v", err)
		}
		if len(recs) == 0 {
			return got
		}
		checkExpired(t, recs, now, max)
		for _, r := range recs {
			if mine[r.ID] {
				got[r.ID]++
			}
		}
	}
	t.Fatal("TakeExpired never ran dry")
	return nil
}

// checkExpired fails t unless recs are at most max cards expired at now.
func checkExpired(t *testing.T, recs []store.PromptRecord, now time.Time, max int) {
	t.Helper()
	if len(recs) > max {
		t.Errorf("TakeExpired(max %d) returned %d cards", max, len(recs))
	}
	for _, r := range recs {
		if r.Expires.After(now) {
			t.Errorf("TakeExpired(%v) returned card %s expiring at %v", now, r.ID, r.Expires)
		}
	}
}

func testTakeExpiredOnlyExpired(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	now := time.Now().Add(-time.Minute).Truncate(time.Second)
	before := card(t, "before", dev, now.Add(-time.Second))
	at := card(t, "at", dev, now) // "not after now" includes now
	after := card(t, "after", dev, now.Add(time.Second))
	live := card(t, "live", dev, time.Now().Add(time.Hour))
	mine := map[string]bool{}
	for _, p := range []store.PromptRecord{before, at, after, live} {
		putPrompt(t, s, p)
		mine[p.ID] = true
	}
	got := takeExpired(t, s, now, 10, mine)
	if len(got) != 2 || got[before.ID] != 1 || got[at.ID] != 1 {
		t.Fatalf("TakeExpired(now) took %v, want %s and %s once each", got, before.ID, at.ID)
	}
	if got := takeExpired(t, s, now, 10, mine); len(got) != 0 {
		t.Fatalf("second TakeExpired(now) took %v again", got)
	}
	got = takeExpired(t, s, time.Now(), 10, mine)
	if len(got) != 1 || got[after.ID] != 1 {
		t.Fatalf("TakeExpired(time.Now()) took %v, want %s once", got, after.ID)
	}
	wantTake(t, s, live, dev, nil)
}

func testTakeExpiredMax(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	now := time.Now()
	mine := map[string]bool{}
	for i := range 5 {
		p := card(t, fmt.Sprint("p", i), dev, now.Add(-time.Duration(i+1)*time.Second))
		putPrompt(t, s, p)
		mine[p.ID] = true
	}
	recs, err := s.TakeExpired(t.Context(), now, 2)
	if err != nil {
		t.Fatalf("TakeExpired: %v", err)
	}
	if len(recs) != 2 {
		t.Fatalf("TakeExpired(max 2) with 5 expired cards returned %d", len(recs))
	}
	checkExpired(t, recs, now, 2)
	got := takeExpired(t, s, now, 2, mine)
	for _, r := range recs {
		if mine[r.ID] {
			got[r.ID]++
		}
	}
	if len(got) != len(mine) {
		t.Fatalf("took %d of my %d expired cards: %v", len(got), len(mine), got)
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("card %s taken %d times", id, n)
		}
	}
}

func testTakeExpiredConcurrent(t *testing.T, s store.Store) {
	const cards, workers = 40, 8
	dev := name(t, "dev")
	now := time.Now()
	mine := map[string]bool{}
	for i := range cards {
		p := card(t, fmt.Sprint("p", i), dev, now.Add(-time.Duration(i+1)*time.Millisecond))
		putPrompt(t, s, p)
		mine[p.ID] = true
	}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got = map[string]int{}
	)
	for range workers {
		wg.Go(func() {
			for range 10000 {
				recs, err := s.TakeExpired(t.Context(), now, 3)
				if err != nil {
					t.Errorf("TakeExpired: %v", err)
					return
				}
				if len(recs) == 0 {
					return
				}
				mu.Lock()
				for _, r := range recs {
					if mine[r.ID] {
						got[r.ID]++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(got) != cards {
		t.Fatalf("took %d of %d expired cards", len(got), cards)
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("card %s returned to %d callers, want exactly one", id, n)
		}
	}
}
