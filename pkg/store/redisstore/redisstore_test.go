package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/storetest"
)

// TestStore runs the conformance suite, every subtest on a Store of its own
// under one prefix, and then checks that every key it left has a TTL.
func TestStore(t *testing.T) {
	t.Parallel()
	url := sharedRedis(t)
	prefix := testPrefix()
	cleanKeys(t, url, prefix, true)
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := New(t.Context(), Options{URL: url, Prefix: prefix})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	})
	storetest.Clocked(t, func(t *testing.T, c clock.Clock) store.Store {
		s, err := New(t.Context(), Options{URL: url, Prefix: prefix, Clock: c})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	})
}

// TestStoreBlobLimit runs the suite on Stores that share the caller's client
// and count blobs against MaxBlobBytes, then checks that the count matches
// the blobs it counted despite the suite's concurrent PutBlob calls.
func TestStoreBlobLimit(t *testing.T) {
	t.Parallel()
	url := sharedRedis(t)
	prefix := testPrefix()
	cleanKeys(t, url, prefix, true)
	rdb := client(t, url)
	t.Cleanup(func() {
		ctx := context.Background()
		members, err := rdb.ZRange(ctx, prefix+"{blobs}:due", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		sum := int64(0)
		for _, m := range members {
			size, _, _ := strings.Cut(m, ":")
			n, err := strconv.ParseInt(size, 10, 64)
			if err != nil {
				t.Fatalf("{blobs}:due member %q", m)
			}
			sum += n
		}
		total, err := rdb.Get(ctx, prefix+"{blobs}:bytes").Int64()
		if err != nil || total != sum || len(members) < 50 {
			t.Fatalf("{blobs}:bytes = %d (%v), want the %d bytes of the %d blobs in {blobs}:due", total, err, sum, len(members))
		}
	})
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := New(t.Context(), Options{Client: rdb, Prefix: prefix, MaxBlobBytes: 1 << 30})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	})
}

// TestRedisDown takes the Redis away from a Store: a Redis that stops
// answering fails calls at their deadline, a killed one fails them with
// store.ErrUnavailable within their deadline, and once it runs again on the
// same port the same Store works again.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := testsvc.StartRedis(t)
	s := newStore(t, srv.URL(), Options{})
	ctx := t.Context()
	if _, err := s.ClaimDevice(ctx, "dev", "edge-1", time.Minute); err != nil {
		t.Fatalf("ClaimDevice with Redis up: %v", err)
	}
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Seen", func(ctx context.Context) error { _, err := s.Seen(ctx, "k"); return err }},
		{"Claim", func(ctx context.Context) error { _, err := s.Claim(ctx, "k", "a", time.Minute); return err }},
		{"PutPart", func(ctx context.Context) error {
			_, err := s.PutPart(ctx, store.Part{Device: "dev", Conn: "c", ID: "f", Count: 2, Data: []byte("x")}, roomy)
			return err
		}},
		{"TakeExpired", func(ctx context.Context) error { _, err := s.TakeExpired(ctx, time.Now(), 10); return err }},
		{"RefreshDevices", func(ctx context.Context) error {
			_, err := s.RefreshDevices(ctx, map[string]int64{"dev": 1}, time.Minute)
			return err
		}},
		{"PushOutbox", func(ctx context.Context) error {
			_, err := s.PushOutbox(ctx, "dev", []byte("x"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute})
			return err
		}},
		{"PutBlob", func(ctx context.Context) error { _, err := s.PutBlob(ctx, []byte("x"), time.Minute); return err }},
	}
	// check runs every call with timeout and fails t unless each fails with
	// ErrUnavailable (and wantAlso, if set) within within.
	check := func(state string, timeout, within time.Duration, wantAlso error) {
		t.Helper()
		for _, c := range calls {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			start := time.Now()
			err := c.call(cctx)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("%s with Redis %s = %v, want ErrUnavailable", c.name, state, err)
			}
			if wantAlso != nil && !errors.Is(err, wantAlso) {
				t.Fatalf("%s with Redis %s = %v, want it to wrap %v too", c.name, state, err, wantAlso)
			}
			t.Logf("%s with Redis %s: %v after %v", c.name, state, err, took.Round(time.Millisecond))
			if took > within {
				t.Fatalf("%s with Redis %s took %v, want at most %v (context timeout %v)", c.name, state, took, within, timeout)
			}
		}
	}
	works := func(state string) {
		t.Helper()
		up := testsvc.Eventually(5*time.Second, func() bool {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := s.Seen(cctx, "k")
			return err == nil
		})
		if !up {
			t.Fatalf("the Store does not work 5s after Redis %s", state)
		}
	}

	// Stopped: the connections stay open and nothing answers.
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	func() {
		defer srv.Signal(syscall.SIGCONT)
		check("stopped", 200*time.Millisecond, 500*time.Millisecond, context.DeadlineExceeded)
	}()
	works("continued")

	// Killed: connections are refused, which New's client (one dial, no
	// command retries) reports at once instead of waiting for the context.
	srv.Kill()
	check("killed", 3*time.Second, time.Second, nil)
	if err := srv.Restart(); err != nil {
		t.Fatalf("restarting redis-server: %v", err)
	}
	works("restarted")
	key, err := s.PutBlob(ctx, []byte("back"), time.Minute)
	if err != nil {
		t.Fatalf("PutBlob after the restart: %v", err)
	}
	if got, err := s.GetBlob(ctx, key); err != nil || string(got) != "back" {
		t.Fatalf("GetBlob after the restart = %q, %v", got, err)
	}
	// The new server started empty: the owner record is gone.
	if _, err := s.DeviceOwner(ctx, "dev"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeviceOwner on the restarted Redis = %v, want ErrNotFound", err)
	}
}

// roomy upload limits that the tests here do not reach unless they mean to.
var roomy = store.UploadLimits{MaxOpen: 8, MaxFileBytes: 1 << 20, MaxBytes: 1 << 20}

// TestStoreAsUserOfItsPrefixOnly runs the suite as a Redis ACL user that
// may touch only the keys (and channels) under its prefix and no dangerous
// command, as an operator sharing one Redis between gateways grants it:
// every key the Store uses is under REDIS_PREFIX. The same user is refused
// a key outside it: the ACL is what the suite ran under.
func TestStoreAsUserOfItsPrefixOnly(t *testing.T) {
	t.Parallel()
	const prefix = "gw1:"
	url := testsvc.StartRedisForPrefix(t, prefix)
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := New(t.Context(), Options{URL: url, Prefix: prefix})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	})
	storetest.Clocked(t, func(t *testing.T, c clock.Clock) store.Store {
		s, err := New(t.Context(), Options{URL: url, Prefix: prefix, Clock: c})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	})
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := rdb.Set(t.Context(), "elsewhere", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("a key outside the prefix: %v; want NOPERM", err)
	}
}
