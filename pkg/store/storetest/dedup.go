package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var dedupTests = []test{
	{"ClaimFirstThenDuplicate", testClaimFirstThenDuplicate},
	{"ClaimRetrySameAttempt", testClaimRetrySameAttempt},
	{"ClaimPendingByAnother", testClaimPendingByAnother},
	{"ClaimKeysIndependent", testClaimKeysIndependent},
	{"ConfirmAfterLapse", testConfirmAfterLapse},
	{"ConfirmByOtherAttempt", testConfirmByOtherAttempt},
	{"ReleaseByHolder", testReleaseByHolder},
	{"ReleaseByOtherAttemptIgnored", testReleaseByOtherAttemptIgnored},
	{"ReleaseUnknownKey", testReleaseUnknownKey},
	{"ReleaseConfirmedIgnored", testReleaseConfirmedIgnored},
	{"PendingClaimLapses", testPendingClaimLapses},
	{"ConfirmedExpires", testConfirmedExpires},
	{"ClaimConcurrent", testClaimConcurrent},
}

func claimErr(t *testing.T, s store.Store, key, attempt string, ttl time.Duration) (bool, error) {
	t.Helper()
	ok, err := s.Claim(t.Context(), key, attempt, ttl)
	if err != nil && !errors.Is(err, store.ErrPending) {
		t.Fatalf("Claim(%q, %q): %v", key, attempt, err)
	}
	return ok, err
}

func claim(t *testing.T, s store.Store, key, attempt string, ttl time.Duration) bool {
	t.Helper()
	ok, err := claimErr(t, s, key, attempt, ttl)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", key, attempt, err)
	}
	return ok
}

func confirm(t *testing.T, s store.Store, key, attempt string, ttl time.Duration) {
	t.Helper()
	if err := s.Confirm(t.Context(), key, attempt, ttl); err != nil {
		t.Fatalf("Confirm(%q, %q): %v", key, attempt, err)
	}
}

func seen(t *testing.T, s store.Store, key string) bool {
	t.Helper()
	ok, err := s.Seen(t.Context(), key)
	if err != nil {
		t.Fatalf("Seen(%q): %v", key, err)
	}
	return ok
}

func release(t *testing.T, s store.Store, key, attempt string) {
	t.Helper()
	if err := s.Release(t.Context(), key, attempt); err != nil {
		t.Fatalf("Release(%q, %q): %v", key, attempt, err)
	}
}

// wantClaim claims key and fails t unless the verdict is want.
func wantClaim(t *testing.T, s store.Store, key, attempt string, want bool) {
	t.Helper()
	if got := claim(t, s, key, attempt, time.Minute); got != want {
		t.Fatalf("Claim(key, %q) = %v, want %v", attempt, got, want)
	}
}

// wantPending claims key as attempt and fails t unless another attempt
// holds it pending.
func wantPending(t *testing.T, s store.Store, key, attempt string) {
	t.Helper()
	if ok, err := claimErr(t, s, key, attempt, time.Minute); ok || !errors.Is(err, store.ErrPending) {
		t.Fatalf("Claim(key, %q) = %v, %v; want ErrPending", attempt, ok, err)
	}
}

func wantSeen(t *testing.T, s store.Store, key string, want bool) {
	t.Helper()
	if got := seen(t, s, key); got != want {
		t.Fatalf("Seen(key) = %v, want %v", got, want)
	}
}

func testClaimFirstThenDuplicate(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantSeen(t, s, key, false)
	wantClaim(t, s, key, "a1", true)
	wantSeen(t, s, key, false) // pending is not delivered
	confirm(t, s, key, "a1", time.Minute)
	wantSeen(t, s, key, true)
	wantClaim(t, s, key, "a2", false)
	wantClaim(t, s, key, "a3", false)
	wantClaim(t, s, key, "a1", false) // the holder's own resend is a duplicate too
	wantSeen(t, s, key, true)
}

func testClaimRetrySameAttempt(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	wantClaim(t, s, key, "a1", true) // the reply to the first call was lost
	wantPending(t, s, key, "a2")
	wantClaim(t, s, key, "a1", true) // a resend in between changes nothing
}

// testClaimPendingByAnother: a resend while the first attempt is pending is
// told to wait, not dropped: the first attempt may still fail.
func testClaimPendingByAnother(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	wantPending(t, s, key, "a2")
	release(t, s, key, "a1") // a1's delivery failed
	wantClaim(t, s, key, "a2", true)
	confirm(t, s, key, "a2", time.Minute)
	wantClaim(t, s, key, "a1", false)
}

func testClaimKeysIndependent(t *testing.T, s store.Store) {
	k1, k2 := name(t, "msg1"), name(t, "msg2")
	wantClaim(t, s, k1, "a1", true)
	confirm(t, s, k1, "a1", time.Minute)
	wantSeen(t, s, k2, false)
	wantClaim(t, s, k2, "a2", true)
	wantClaim(t, s, k1, "a2", false)
	wantPending(t, s, k2, "a1")
}

// testConfirmAfterLapse: a holder whose pending claim lapsed while it
// delivered still records the key, unless another attempt took it.
func testConfirmAfterLapse(t *testing.T, s store.Store) {
	key := name(t, "msg")
	confirm(t, s, key, "a1", time.Minute) // no claim at all (it lapsed)
	wantSeen(t, s, key, true)
	wantClaim(t, s, key, "a2", false)
}

// testConfirmByOtherAttempt: a Confirm by an attempt that does not hold the
// key changes nothing.
func testConfirmByOtherAttempt(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	confirm(t, s, key, "a2", time.Minute)
	wantSeen(t, s, key, false)
	wantClaim(t, s, key, "a1", true)
	confirm(t, s, key, "a1", time.Minute)
	confirm(t, s, key, "a2", time.Minute)
	wantClaim(t, s, key, "a2", false)
	wantClaim(t, s, key, "a1", false)
}

func testReleaseByHolder(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	release(t, s, key, "a1")
	wantSeen(t, s, key, false)
	wantClaim(t, s, key, "a2", true) // the client's retry is a first delivery
	wantPending(t, s, key, "a1")
	// A late Release by the attempt that no longer holds key is ignored.
	release(t, s, key, "a1")
	wantPending(t, s, key, "a3")
}

func testReleaseByOtherAttemptIgnored(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	release(t, s, key, "a2")
	wantPending(t, s, key, "a3")
	wantClaim(t, s, key, "a1", true)
}

func testReleaseUnknownKey(t *testing.T, s store.Store) {
	key := name(t, "msg")
	release(t, s, key, "a1")
	wantSeen(t, s, key, false)
	wantClaim(t, s, key, "a1", true)
}

// testReleaseConfirmedIgnored: a delivered key stays, whoever releases it.
func testReleaseConfirmedIgnored(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	confirm(t, s, key, "a1", time.Minute)
	release(t, s, key, "a1")
	wantSeen(t, s, key, true)
	wantClaim(t, s, key, "a2", false)
}

// testPendingClaimLapses: a pending claim nobody confirms (its holder died)
// frees the key after its ttl: the client's resend is then a first delivery.
func testPendingClaimLapses(t *testing.T, s store.Store) {
	key, long := name(t, "short"), name(t, "long")
	if !claim(t, s, key, "dead", time.Second) {
		t.Fatal("first Claim = false")
	}
	wantClaim(t, s, long, "a1", true)
	eventually(t, expiryWait, "a pending claim of 1s lapsing", func() bool {
		ok, _ := claimErr(t, s, key, "resend", time.Minute)
		return ok
	})
	wantPending(t, s, long, "a2") // a key claimed for a minute is still pending
}

// testConfirmedExpires: a confirmed key is forgotten after the Confirm ttl.
func testConfirmedExpires(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	confirm(t, s, key, "a1", time.Second)
	wantSeen(t, s, key, true)
	eventually(t, expiryWait, "a key confirmed for 1s is forgotten", func() bool { return !seen(t, s, key) })
	wantClaim(t, s, key, "a2", true)
}

func testClaimConcurrent(t *testing.T, s store.Store) {
	const n = 32
	key := name(t, "msg")
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  []string
		fail error
	)
	for i := range n {
		wg.Go(func() {
			attempt := fmt.Sprintf("a%d", i)
			ok, err := s.Claim(t.Context(), key, attempt, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !errors.Is(err, store.ErrPending) {
				fail = err
			}
			if ok {
				won = append(won, attempt)
			}
		})
	}
	wg.Wait()
	if fail != nil {
		t.Fatalf("Claim: %v", fail)
	}
	if len(won) != 1 {
		t.Fatalf("%d concurrent Claims of one key returned true (%v), want 1", len(won), won)
	}
	wantClaim(t, s, key, won[0], true)
}
