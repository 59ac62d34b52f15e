package redisstore

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// The tests need a Redis. sharedRedis picks one for the conformance suite:
// $REDIS_URL if set, else 127.0.0.1:6379 if it answers PING, else a
// redis-server from $PATH started for this process (stopped by TestMain).
// Tests that kill or reconfigure their server always start a private one.
// Without any, the tests skip, or fail when $CI is set.

const enableHint = "set REDIS_URL=redis://host:port, run a Redis on 127.0.0.1:6379, or put redis-server on $PATH"

var shared struct {
	once sync.Once
	url  string
	srv  *testsvc.Server // started by sharedRedis; nil when the Redis was found
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Kill()
	}
	os.Exit(code)
}

// noRedis skips t, or fails it under CI, because no Redis can be used.
func noRedis(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("no Redis for the redisstore tests (%s); %s", why, enableHint)
	}
	t.Skipf("no Redis for the redisstore tests (%s); %s", why, enableHint)
}

// sharedRedis returns the URL of the Redis that tests may share.
func sharedRedis(t *testing.T) string {
	t.Helper()
	shared.once.Do(func() {
		if url := os.Getenv("REDIS_URL"); url != "" {
			shared.url = url
			return
		}
		if testsvc.RedisPing("127.0.0.1:6379") == nil {
			shared.url = "redis://127.0.0.1:6379"
			return
		}
		// It writes nothing in its directory: no persistence.
		shared.srv, shared.err = testsvc.NewRedis(os.TempDir())
		if shared.err != nil {
			return
		}
		shared.url = shared.srv.URL()
	})
	if shared.err != nil {
		noRedis(t, shared.err.Error())
	}
	return shared.url
}

// testPrefix returns a key prefix that no other test run uses.
func testPrefix() string {
	return "hermes-test:" + testsvc.RandomHex(6) + ":"
}

// client returns a go-redis client for url, closed when t ends.
func client(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// keys returns the keys that start with prefix.
func keys(ctx context.Context, c *redis.Client, prefix string) ([]string, error) {
	var out []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	return out, iter.Err()
}

// cleanKeys deletes the keys under prefix when t ends; with checkTTL it
// first fails t for every such key that has no TTL.
func cleanKeys(t *testing.T, url, prefix string, checkTTL bool) {
	t.Helper()
	c := client(t, url)
	t.Cleanup(func() {
		ctx := context.Background()
		ks, err := keys(ctx, c, prefix)
		if err != nil {
			t.Errorf("SCAN %s*: %v", prefix, err)
			return
		}
		for _, k := range ks {
			if !checkTTL {
				break
			}
			if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl == -1 {
				t.Errorf("key %q has no TTL", k)
			}
		}
		for len(ks) > 0 {
			n := min(len(ks), 500)
			if err := c.Del(ctx, ks[:n]...).Err(); err != nil {
				t.Errorf("DEL: %v", err)
				return
			}
			ks = ks[n:]
		}
	})
}

// newStore returns a Store on url under a fresh prefix, closed and cleaned
// when t ends.
func newStore(t *testing.T, url string, opts Options) *Store {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testPrefix()
	}
	opts.URL = url
	s, err := New(t.Context(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	cleanKeys(t, url, opts.Prefix, false)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}
