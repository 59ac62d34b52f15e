// Package storetest is the conformance suite for store.Store, run by every
// implementation from its own tests:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			return memstore.New(memstore.Options{})
//		})
//	}
//
// Each subtest takes a store of its own from newStore, runs in parallel with
// the others and closes the store when it ends (the factory must not close
// it too). Devices, keys, connections and prompt ids are made unique per test
// and per process, so the stores may share one backend, such as one Redis
// database, with each other and with other users.
//
// TakeExpired is the one global call: it returns the expired cards of every
// user of the backend. The subtests that call it run one after another and
// ignore cards that are not theirs, but two suite runs sharing one backend at
// the same moment could take each other's cards; give each run its own key
// prefix or database.
//
// Expiry is tested with ttls of about a second and polling, so the suite takes
// a few seconds.
package storetest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// Run runs the conformance suite against the stores that newStore returns.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	groups := []struct {
		name  string
		tests []test
	}{
		{"Dedup", dedupTests},
		{"Uploads", uploadTests},
		{"Prompts", promptTests},
		{"Owners", ownerTests},
		{"Outbox", outboxTests},
		{"Blobs", blobTests},
		{"Events", eventTests},
		{"History", historyTests},
		{"Journal", journalTests},
		{"Sleep", sleepTests},
		{"Usage", usageTests},
		{"Context", contextTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.run(t, open(t, newStore))
				})
			}
		})
	}
}

// test is one subtest, run on a store of its own.
type test struct {
	name string
	run  func(t *testing.T, s store.Store)
}

// open returns a new store that is closed when t ends.
func open(t *testing.T, newStore func(t *testing.T) store.Store) store.Store {
	t.Helper()
	s := newStore(t)
	if s == nil {
		t.Fatal("newStore returned nil")
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// runID keeps the names of two processes sharing a backend apart.
var runID = func() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// name returns a name for what that no other test or process uses.
func name(t *testing.T, what string) string {
	return "storetest:" + runID + ":" + t.Name() + ":" + what
}

// Expiry is polled for this long before a test gives up; ttls are about a
// second.
const (
	expiryWait = 5 * time.Second
	pollEvery  = 20 * time.Millisecond
)

// eventually polls cond until it holds and fails t if it does not hold
// within wait.
func eventually(t *testing.T, wait time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after %v", what, wait)
		}
		time.Sleep(pollEvery) // poll interval: the loop waits for its condition
	}
}
