package testsvc

import (
	"testing"
	"time"
)

// pollEvery is how often WaitFor and Eventually look at their condition.
const pollEvery = 20 * time.Millisecond

// WaitFor polls cond every 20 ms until it holds, failing t after limit
// (scaled by Slack under -race) with what it waited for: "waited 10s for
// <what>".
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(limit, cond) {
		t.Fatalf("waited %v for %s", Slack(limit), what)
	}
}

// Eventually polls cond every 20 ms until it holds, and reports whether it
// did within limit (scaled by Slack under -race). It is for a test that
// goes on when the condition never came, or says more than WaitFor would.
func Eventually(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(Slack(limit))
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery) // poll interval, not a wait for the condition
	}
	return true
}

// WaitChan waits for ch to deliver a value, failing t after limit (scaled by
// Slack) with what it waited for.
func WaitChan[T any](t testing.TB, limit time.Duration, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Slack(limit)):
		t.Fatalf("waited %v for %s", Slack(limit), what)
		var zero T
		return zero
	}
}
