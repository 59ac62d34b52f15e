package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var dedupTests = []test{
	{"ClaimFirstThenDuplicate", testClaimFirstThenDuplicate},
	{"ClaimRetrySameAttempt", testClaimRetrySameAttempt},
	{"ClaimKeysIndependent", testClaimKeysIndependent},
	{"ReleaseByHolder", testReleaseByHolder},
	{"ReleaseByOtherAttemptIgnored", testReleaseByOtherAttemptIgnored},
	{"ReleaseUnknownKey", testReleaseUnknownKey},
	{"ClaimExpires", testClaimExpires},
	{"ClaimConcurrent", testClaimConcurrent},
}

func claim(t *testing.T, s store.Store, key, attempt string, ttl time.Duration) bool {
	t.Helper()
	ok, err := s.Claim(t.Context(), key, attempt, ttl)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", key, attempt, err)
	}
	return ok
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
	wantSeen(t, s, key, true)
	wantClaim(t, s, key, "a2", false)
	wantClaim(t, s, key, "a3", false)
	wantSeen(t, s, key, true)
}

func testClaimRetrySameAttempt(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	wantClaim(t, s, key, "a1", true) // the reply to the first call was lost
	wantClaim(t, s, key, "a2", false)
	wantClaim(t, s, key, "a1", true) // a duplicate in between changes nothing
}

func testClaimKeysIndependent(t *testing.T, s store.Store) {
	k1, k2 := name(t, "msg1"), name(t, "msg2")
	wantClaim(t, s, k1, "a1", true)
	wantSeen(t, s, k2, false)
	wantClaim(t, s, k2, "a2", true)
	wantClaim(t, s, k1, "a2", false)
}

func testReleaseByHolder(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	release(t, s, key, "a1")
	wantSeen(t, s, key, false)
	wantClaim(t, s, key, "a2", true) // the client's retry is a first delivery
	wantClaim(t, s, key, "a1", false)
	// A late Release by the attempt that no longer holds key is ignored.
	release(t, s, key, "a1")
	wantSeen(t, s, key, true)
	wantClaim(t, s, key, "a3", false)
}

func testReleaseByOtherAttemptIgnored(t *testing.T, s store.Store) {
	key := name(t, "msg")
	wantClaim(t, s, key, "a1", true)
	release(t, s, key, "a2")
	wantSeen(t, s, key, true)
	wantClaim(t, s, key, "a3", false)
	wantClaim(t, s, key, "a1", true)
}

func testReleaseUnknownKey(t *testing.T, s store.Store) {
	key := name(t, "msg")
	release(t, s, key, "a1")
	wantSeen(t, s, key, false)
	wantClaim(t, s, key, "a1", true)
}

func testClaimExpires(t *testing.T, s store.Store) {
	key, long := name(t, "short"), name(t, "long")
	if !claim(t, s, key, "a1", time.Second) {
		t.Fatal("first Claim = false")
	}
	wantClaim(t, s, long, "a1", true)
	wantSeen(t, s, key, true)
	eventually(t, expiryWait, "key claimed for 1s is seen", func() bool { return !seen(t, s, key) })
	wantClaim(t, s, key, "a2", true)
	wantSeen(t, s, long, true) // a key claimed for a minute is still there
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
			if err != nil {
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
