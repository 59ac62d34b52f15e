package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var journalTests = []test{
	{"Order", testJournalOrder},
	{"Bound", testJournalBound},
	{"Holder", testJournalHolder},
	{"Renew", testJournalRenew},
	{"DoneOnce", testJournalDoneOnce},
	{"SeqAfterEmpty", testJournalSeqAfterEmpty},
	{"ReleaseRacesAppend", testJournalReleaseRacesAppend},
	{"DevicesIndependent", testJournalDevicesIndependent},
	{"TTL", testJournalTTL},
	{"Leases", testJournalLeases},
	{"AppendReportsHead", testJournalAppendReportsHead},
}

// jlim is a roomy journal: the lease outlives every test.
var jlim = store.JournalLimits{MaxLen: 100, Lease: time.Minute, TTL: time.Hour}

func appendJ(t *testing.T, s store.Store, device, owner, data string, lim store.JournalLimits) bool {
	t.Helper()
	a, err := s.AppendJournal(t.Context(), device, owner, []byte(data), lim)
	if err != nil {
		t.Fatalf("AppendJournal(%q, %q): %v", owner, data, err)
	}
	return a.Leased
}

func nextJ(t *testing.T, s store.Store, device, owner string, done int64) (store.JournalEntry, bool) {
	t.Helper()
	e, ok, err := s.NextJournal(t.Context(), device, owner, done, time.Minute)
	if err != nil {
		t.Fatalf("NextJournal(%q, %d): %v", owner, done, err)
	}
	return e, ok
}

// drainJ works device's journal as owner until it is empty and returns the
// entries, in order.
func drainJ(t *testing.T, s store.Store, device, owner string) []string {
	t.Helper()
	var got []string
	var done int64
	for {
		e, ok := nextJ(t, s, device, owner, done)
		if !ok {
			return got
		}
		got = append(got, string(e.Data))
		done = e.Seq
	}
}

func wantLeaseLost(t *testing.T, s store.Store, device, owner string) {
	t.Helper()
	if _, _, err := s.NextJournal(t.Context(), device, owner, 0, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("NextJournal by %q = %v, want ErrLeaseLost", owner, err)
	}
}

func testJournalOrder(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	for _, d := range []string{"a", "b", "c"} {
		if !appendJ(t, s, dev, "r1", d, jlim) {
			t.Fatalf("append of %q by the first appender did not hold the lease", d)
		}
	}
	var last int64
	var got []string
	var done int64
	for {
		e, ok := nextJ(t, s, dev, "r1", done)
		if !ok {
			break
		}
		if e.Seq <= last {
			t.Fatalf("Seq %d after %d, want growing", e.Seq, last)
		}
		last, done = e.Seq, e.Seq
		got = append(got, string(e.Data))
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("entries = %q, want %q", got, want)
	}
	// Reading the empty journal released the lease.
	wantLeaseLost(t, s, dev, "r1")
	if !appendJ(t, s, dev, "r2", "d", jlim) {
		t.Fatal("an append after the release did not take the lease")
	}
	if got := drainJ(t, s, dev, "r2"); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("entries = %q, want [d]", got)
	}
}

// testJournalAppendReportsHead: the append that takes the lease reports the
// head as NextJournal with done 0 returns it, the oldest entry, not the one
// appended; appends that find the lease held, by the caller or another,
// report no head.
func testJournalAppendReportsHead(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	a, err := s.AppendJournal(t.Context(), dev, "r1", []byte("first"), jlim)
	if err != nil || !a.Leased || a.Head == nil || string(a.Head.Data) != "first" || a.Head.Takeovers != 0 {
		t.Fatalf("first append = %+v (head %+v), %v; want the lease and head first", a, a.Head, err)
	}
	first := a.Head.Seq
	for _, owner := range []string{"r1", "r2"} {
		got, err := s.AppendJournal(t.Context(), dev, owner, []byte("more by "+owner), jlim)
		if err != nil || got.Leased != (owner == "r1") || got.Head != nil {
			t.Fatalf("append by %s with the lease held by r1 = %+v (head %+v), %v", owner, got, got.Head, err)
		}
	}
	if e, ok := nextJ(t, s, dev, "r1", 0); !ok || e.Seq != first || string(e.Data) != "first" {
		t.Fatalf("NextJournal = %+v, %v; want the head the append reported, seq %d", e, ok, first)
	}
	// Released with entries left: the next append takes the lease and
	// reports the oldest of them.
	if err := s.ReleaseJournal(t.Context(), dev, "r1"); err != nil {
		t.Fatal(err)
	}
	a, err = s.AppendJournal(t.Context(), dev, "r3", []byte("last"), jlim)
	if err != nil || !a.Leased || a.Head == nil || a.Head.Seq != first || string(a.Head.Data) != "first" {
		t.Fatalf("append after the release = %+v (head %+v), %v; want the lease and head first", a, a.Head, err)
	}
}

// testJournalBound: MaxLen entries are accepted, one more is refused until
// an entry is done.
func testJournalBound(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := jlim
	lim.MaxLen = 3
	for i := range 3 {
		appendJ(t, s, dev, "r1", fmt.Sprint(i), lim)
	}
	a, err := s.AppendJournal(t.Context(), dev, "r1", []byte("3"), lim)
	if !errors.Is(err, store.ErrJournalFull) {
		t.Fatalf("append past MaxLen = %v, want ErrJournalFull", err)
	}
	if !a.Leased {
		t.Error("a refused append reports the lease as not held by its holder")
	}
	e, _ := nextJ(t, s, dev, "r1", 0)
	nextJ(t, s, dev, "r1", e.Seq) // done with "0"
	appendJ(t, s, dev, "r1", "3", lim)
	if got, want := drainJ(t, s, dev, "r1"), []string{"1", "2", "3"}; !slices.Equal(got, want) {
		t.Fatalf("entries = %q, want %q", got, want)
	}
	lim.MaxLen = 0
	if _, err := s.AppendJournal(t.Context(), name(t, "dev0"), "r1", []byte("x"), lim); !errors.Is(err, store.ErrJournalFull) {
		t.Fatalf("append with MaxLen 0 = %v, want ErrJournalFull", err)
	}
}

// testJournalHolder: only the holder reads, renews and releases.
func testJournalHolder(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	if !appendJ(t, s, dev, "r1", "a", jlim) {
		t.Fatal("first append did not take the free lease")
	}
	if appendJ(t, s, dev, "r2", "b", jlim) {
		t.Fatal("a second appender got a held lease")
	}
	wantLeaseLost(t, s, dev, "r2")
	if err := s.RenewJournal(t.Context(), dev, "r2", time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("RenewJournal by a non-holder = %v, want ErrLeaseLost", err)
	}
	if err := s.ReleaseJournal(t.Context(), dev, "r2"); err != nil {
		t.Fatalf("ReleaseJournal by a non-holder: %v", err)
	}
	if err := s.RenewJournal(t.Context(), dev, "r1", time.Minute); err != nil {
		t.Fatalf("RenewJournal by the holder after a stranger's release: %v", err)
	}
	if !appendJ(t, s, dev, "r1", "c", jlim) {
		t.Fatal("the holder's append reports the lease as not held")
	}
	if got, want := drainJ(t, s, dev, "r1"), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("entries = %q, want %q", got, want)
	}
}

// testJournalRenew: a lease renewed within its length is kept past it. The
// store's own clock says when the first length has passed: a control
// journal, leased just before with the same length and never renewed, is
// polled until another owner can take it.
func testJournalRenew(t *testing.T, s store.Store) {
	dev, control := name(t, "dev"), name(t, "control")
	lim := jlim
	lim.Lease = 2 * time.Second
	lim.MaxLen = 100_000 // each poll below appends to the control
	appendJ(t, s, control, "r1", "x", lim)
	appendJ(t, s, dev, "r1", "a", lim)
	if err := s.RenewJournal(t.Context(), dev, "r1", time.Hour); err != nil {
		t.Fatalf("RenewJournal: %v", err)
	}
	eventually(t, expiryWait, "the control's unrenewed lease lapsing", func() bool {
		return appendJ(t, s, control, "r2", "y", lim)
	})
	if appendJ(t, s, dev, "r2", "b", lim) {
		t.Fatal("a renewed lease was taken")
	}
	if err := s.RenewJournal(t.Context(), dev, "r1", time.Hour); err != nil {
		t.Fatalf("RenewJournal past the first length: %v", err)
	}
	if got, want := drainJ(t, s, dev, "r1"), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("entries = %q, want %q", got, want)
	}
}

// testJournalSeqAfterEmpty: once a journal was worked empty, its next
// entry still gets a greater Seq, so a late repeat of the last NextJournal
// (a retry after a lost reply) cannot remove it unhandled.
func testJournalSeqAfterEmpty(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	appendJ(t, s, dev, "r1", "a", jlim)
	a, _ := nextJ(t, s, dev, "r1", 0)
	if _, ok := nextJ(t, s, dev, "r1", a.Seq); ok {
		t.Fatal("NextJournal after the only entry: an entry, want none")
	}
	appendJ(t, s, dev, "r1", "b", jlim)
	b, ok := nextJ(t, s, dev, "r1", a.Seq)
	if !ok || string(b.Data) != "b" {
		t.Fatalf("NextJournal(done = the emptied journal's last %d) = %+v, %v; want b", a.Seq, b, ok)
	}
	if b.Seq <= a.Seq {
		t.Fatalf("Seq after the journal was emptied: %d, want more than %d", b.Seq, a.Seq)
	}
}

// testJournalDoneOnce: repeating a NextJournal with the same done (a retry
// after a lost reply) removes one entry, not two.
func testJournalDoneOnce(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	for _, d := range []string{"a", "b", "c"} {
		appendJ(t, s, dev, "r1", d, jlim)
	}
	a, _ := nextJ(t, s, dev, "r1", 0)
	b1, _ := nextJ(t, s, dev, "r1", a.Seq)
	b2, _ := nextJ(t, s, dev, "r1", a.Seq)
	if string(b1.Data) != "b" || b2.Seq != b1.Seq || string(b2.Data) != "b" {
		t.Fatalf("after done a twice: %q then %q, want b twice", b1.Data, b2.Data)
	}
	if got, want := drainJ(t, s, dev, "r1"), []string{"b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("entries = %q, want %q", got, want)
	}
}

// testJournalReleaseRacesAppend: appenders race the holder's final read,
// which releases the lease: whoever appends while the lease is held leaves
// the entry to the holder, whoever finds it free works the journal. No
// entry is stranded, each is worked once, each appender's in its order.
func testJournalReleaseRacesAppend(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	const appenders, each = 6, 40
	lim := jlim
	lim.MaxLen = appenders * each
	var mu sync.Mutex
	var worked []string
	var wg sync.WaitGroup
	for g := range appenders {
		owner := fmt.Sprintf("r%d", g)
		wg.Go(func() {
			for i := range each {
				a, err := s.AppendJournal(t.Context(), dev, owner, []byte(fmt.Sprintf("%d:%03d", g, i)), lim)
				if err != nil {
					t.Errorf("AppendJournal: %v", err)
					return
				}
				if !a.Leased {
					continue
				}
				var done int64
				for {
					e, ok, err := s.NextJournal(t.Context(), dev, owner, done, time.Minute)
					if err != nil {
						t.Errorf("NextJournal by the holder: %v", err)
						return
					}
					if !ok {
						break
					}
					mu.Lock()
					worked = append(worked, string(e.Data))
					mu.Unlock()
					done = e.Seq
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Nothing is left: a checker's entry is the only one it reads.
	if !appendJ(t, s, dev, "checker", "end", lim) {
		t.Fatal("the lease is still held after every worker finished")
	}
	if got := drainJ(t, s, dev, "checker"); !slices.Equal(got, []string{"end"}) {
		t.Fatalf("left in the journal: %q, want only the checker's entry", got)
	}
	if len(worked) != appenders*each {
		t.Fatalf("worked %d entries, want %d", len(worked), appenders*each)
	}
	seen := make(map[string]bool)
	last := make(map[byte]string)
	for _, w := range worked {
		if seen[w] {
			t.Fatalf("entry %s worked twice", w)
		}
		seen[w] = true
		if w < last[w[0]] {
			t.Fatalf("entry %s worked after %s", w, last[w[0]])
		}
		last[w[0]] = w
	}
}

func testJournalDevicesIndependent(t *testing.T, s store.Store) {
	d1, d2 := name(t, "dev1"), name(t, "dev2")
	lim := jlim
	lim.MaxLen = 1
	appendJ(t, s, d1, "r1", "a", lim)
	if !appendJ(t, s, d2, "r2", "b", lim) {
		t.Fatal("another device's lease is held")
	}
	wantLeaseLost(t, s, d1, "r2")
	if got := drainJ(t, s, d2, "r2"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("dev2 entries = %q, want [b]", got)
	}
	if got := drainJ(t, s, d1, "r1"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("dev1 entries = %q, want [a]", got)
	}
}

// testJournalTTL: a journal nobody worked is forgotten, with its lease,
// TTL after its last append.
func testJournalTTL(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := jlim
	lim.TTL = 500 * time.Millisecond
	appendJ(t, s, dev, "r1", "old", lim)
	time.Sleep(lim.TTL + 300*time.Millisecond) // the TTL under test, on the store's clock (Redis's own for redisstore)
	if !appendJ(t, s, dev, "r2", "new", jlim) {
		t.Fatal("the lease of a forgotten journal is still held")
	}
	if got := drainJ(t, s, dev, "r2"); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("entries = %q, want [new]", got)
	}
}

// testJournalLeases runs its subtests one after another: TakeJournals takes
// the free journals of every test sharing the backend, so the tests that
// leave a journal with entries and a free lease run here only.
func testJournalLeases(t *testing.T, s store.Store) {
	t.Run("Release", func(t *testing.T) { testJournalRelease(t, s) })
	t.Run("Expiry", func(t *testing.T) { testJournalExpiry(t, s) })
	t.Run("Takeover", func(t *testing.T) { testJournalTakeover(t, s) })
	t.Run("TakeOnce", func(t *testing.T) { testJournalTakeOnce(t, s) })
	t.Run("Takeovers", func(t *testing.T) { testJournalTakeovers(t, s) })
}

// takeJ calls TakeJournals for owner and returns which of mine it took.
func takeJ(t *testing.T, s store.Store, owner string, lease time.Duration, mine ...string) []string {
	t.Helper()
	devs, err := s.TakeJournals(t.Context(), owner, lease, 1000)
	if err != nil {
		t.Fatalf("TakeJournals: %v", err)
	}
	var out []string
	for _, d := range devs {
		if slices.Contains(mine, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// testJournalRelease: a released journal keeps its entries and goes to the
// next appender, or to TakeJournals at once.
func testJournalRelease(t *testing.T, s store.Store) {
	d1, d2 := name(t, "dev1"), name(t, "dev2")
	appendJ(t, s, d1, "r1", "a", jlim)
	appendJ(t, s, d2, "r1", "b", jlim)
	for _, d := range []string{d1, d2} {
		if err := s.ReleaseJournal(t.Context(), d, "r1"); err != nil {
			t.Fatalf("ReleaseJournal: %v", err)
		}
	}
	wantLeaseLost(t, s, d1, "r1")
	if !appendJ(t, s, d1, "r2", "c", jlim) {
		t.Fatal("an append after a release did not take the lease")
	}
	if got := takeJ(t, s, "r3", time.Minute, d1, d2); !slices.Equal(got, []string{d2}) {
		t.Fatalf("TakeJournals took %q, want only the released journal", got)
	}
	if got, want := drainJ(t, s, d1, "r2"), []string{"a", "c"}; !slices.Equal(got, want) {
		t.Fatalf("dev1 entries = %q, want %q", got, want)
	}
	if got := drainJ(t, s, d2, "r3"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("dev2 entries = %q, want [b]", got)
	}
	if got := takeJ(t, s, "r3", time.Minute, d1, d2); len(got) != 0 {
		t.Fatalf("TakeJournals took the empty journals %q", got)
	}
}

// testJournalExpiry: a lease not renewed is free after its length: the next
// appender takes it and the old holder has lost it.
func testJournalExpiry(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := jlim
	lim.Lease = 400 * time.Millisecond
	appendJ(t, s, dev, "r1", "a", lim)
	// Not asserted on dev: "a live lease is not taken" is jlim's (a minute),
	// in testJournalHolder; 400 ms may pass before the next call on a busy
	// machine.
	appendJ(t, s, dev, "r2", "b", lim)
	eventually(t, expiryWait, "r2 taking the lapsed lease", func() bool {
		return appendJ(t, s, dev, "r2", "c", jlim)
	})
	wantLeaseLost(t, s, dev, "r1")
	if err := s.RenewJournal(t.Context(), dev, "r1", time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("RenewJournal of an expired lease = %v, want ErrLeaseLost", err)
	}
	// Every poll appended a "c"; the last one took the lease.
	if got := drainJ(t, s, dev, "r2"); len(got) < 3 || !slices.Equal(got[:2], []string{"a", "b"}) ||
		slices.ContainsFunc(got[2:], func(e string) bool { return e != "c" }) {
		t.Fatalf("entries = %q, want a, b, then only c", got)
	}
}

// testJournalTakeover: TakeJournals hands out a journal whose holder
// stopped renewing once its lease expired, and not before.
func testJournalTakeover(t *testing.T, s store.Store) {
	dev, idle := name(t, "dev"), name(t, "idle")
	lim := jlim
	lim.Lease = time.Second
	start := time.Now()
	appendJ(t, s, dev, "r1", "a", lim)
	appendJ(t, s, dev, "r1", "b", lim)
	appendJ(t, s, idle, "r1", "x", lim)
	drainJ(t, s, idle, "r1") // empty: never handed out
	if _, ok, err := s.NextJournal(t.Context(), dev, "r1", 0, lim.Lease); !ok || err != nil {
		t.Fatalf("NextJournal = %v, %v; want the first entry", ok, err)
	}
	// r1 now dies mid-entry.
	var took time.Duration
	eventually(t, expiryWait, "takeover of the expired lease", func() bool {
		got := takeJ(t, s, "r2", time.Minute, dev, idle)
		if len(got) > 0 {
			took = time.Since(start)
			if !slices.Equal(got, []string{dev}) {
				t.Fatalf("TakeJournals took %q, want only %q", got, dev)
			}
			return true
		}
		return false
	})
	if took < 900*time.Millisecond {
		t.Fatalf("taken %v after the append, before the 1 s lease expired", took)
	}
	wantLeaseLost(t, s, dev, "r1")
	if got, want := drainJ(t, s, dev, "r2"), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("entries = %q, want %q: the entry in progress is worked again", got, want)
	}
}

// testJournalTakeOnce: concurrent TakeJournals give each free journal to
// exactly one caller.
func testJournalTakeOnce(t *testing.T, s store.Store) {
	var devs []string
	for i := range 20 {
		d := name(t, fmt.Sprint("dev", i))
		devs = append(devs, d)
		appendJ(t, s, d, "r1", "a", jlim)
		if err := s.ReleaseJournal(t.Context(), d, "r1"); err != nil {
			t.Fatalf("ReleaseJournal: %v", err)
		}
	}
	var mu sync.Mutex
	count := make(map[string]int)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for range 5 {
				got := takeJ(t, s, fmt.Sprint("taker", w), time.Minute, devs...)
				mu.Lock()
				for _, d := range got {
					count[d]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, d := range devs {
		if count[d] != 1 {
			t.Errorf("%s taken %d times, want once", d, count[d])
		}
	}
}

// testJournalTakeovers: the head's Takeovers rise with each takeover of an
// expired lease, by TakeJournals or by an append, not with a release; they
// start again at 0 for the next head, and belong to their device.
func testJournalTakeovers(t *testing.T, s store.Store) {
	dev, other := name(t, "dev"), name(t, "other")
	const lease = 400 * time.Millisecond
	lim := jlim
	lim.Lease = lease
	// head reads dev's head as owner (removing done) and checks its count.
	head := func(owner string, done int64, data string, takeovers int) int64 {
		t.Helper()
		e, ok, err := s.NextJournal(t.Context(), dev, owner, done, lease)
		if err != nil || !ok {
			t.Fatalf("NextJournal by %s = %v, %v; want an entry", owner, ok, err)
		}
		if string(e.Data) != data || e.Takeovers != takeovers {
			t.Fatalf("head = %q with %d takeovers, want %q with %d", e.Data, e.Takeovers, data, takeovers)
		}
		return e.Seq
	}
	// takeLapsed waits for dev's lease to expire and takes it as owner.
	takeLapsed := func(owner string) {
		t.Helper()
		eventually(t, expiryWait, "takeover of the expired lease", func() bool {
			return slices.Equal(takeJ(t, s, owner, lease, dev, other), []string{dev})
		})
	}
	appendJ(t, s, dev, "r1", "a", lim)
	appendJ(t, s, dev, "r1", "b", lim)
	appendJ(t, s, other, "r1", "x", jlim) // held for a minute: never taken
	head("r1", 0, "a", 0)

	// A release is no takeover.
	if err := s.ReleaseJournal(t.Context(), dev, "r1"); err != nil {
		t.Fatalf("ReleaseJournal: %v", err)
	}
	if got := takeJ(t, s, "r2", lease, dev, other); !slices.Equal(got, []string{dev}) {
		t.Fatalf("TakeJournals took %q, want the released %q", got, dev)
	}
	head("r2", 0, "a", 0)

	// r2 stops renewing: TakeJournals counts the takeover.
	takeLapsed("r3")
	head("r3", 0, "a", 1)

	// r3 stops renewing: an append that takes the lease counts too.
	time.Sleep(lease + 200*time.Millisecond) // the lease's lapse under test, on the store's clock
	took, err := s.AppendJournal(t.Context(), dev, "r4", []byte("c"), lim)
	if err != nil || !took.Leased {
		t.Fatalf("an append did not take the expired lease: %+v, %v", took, err)
	}
	if h := took.Head; h == nil || string(h.Data) != "a" || h.Takeovers != 2 {
		t.Fatalf("the append that took the lease reported head %+v, want a with 2 takeovers", h)
	}
	a := head("r4", 0, "a", 2)
	if a != took.Head.Seq {
		t.Fatalf("the append reported head seq %d, NextJournal %d", took.Head.Seq, a)
	}

	// Another device's count is its own.
	e, ok, err := s.NextJournal(t.Context(), other, "r1", 0, time.Minute)
	if err != nil || !ok || e.Takeovers != 0 {
		t.Fatalf("other device's head = %+v, %v, %v; want x with 0 takeovers", e, ok, err)
	}

	// Removing the head starts the count again for the next one.
	head("r4", a, "b", 0)
	takeLapsed("r5")
	b := head("r5", 0, "b", 1)
	head("r5", b, "c", 0)
	if got := drainJ(t, s, dev, "r5"); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("entries = %q, want [c]", got)
	}
	if got := drainJ(t, s, other, "r1"); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("other entries = %q, want [x]", got)
	}
}
