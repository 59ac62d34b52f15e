// Package testsvc finds the Redis and the NATS that tests talk to: the one
// named by REDIS_URL / NATS_URL, else the standard local port. Without one
// the test is skipped with a message saying how to enable it, or fails when
// the CI variable is set, so CI never passes by skipping.
package testsvc

import (
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// RedisURL returns the Redis for tests.
func RedisURL(t testing.TB) string {
	t.Helper()
	return find(t, "REDIS_URL", "redis://127.0.0.1:6379", "a Redis")
}

// NATSURL returns the NATS for tests.
func NATSURL(t testing.TB) string {
	t.Helper()
	return find(t, "NATS_URL", "nats://127.0.0.1:4222", "a NATS")
}

func find(t testing.TB, env, def, what string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		u = def
	}
	parsed, err := url.Parse(u)
	if err != nil || parsed.Host == "" {
		t.Fatalf("%s=%q is not a URL", env, u)
	}
	c, err := net.DialTimeout("tcp", parsed.Host, time.Second)
	if err != nil {
		Missing(t, "this test needs "+what+" (set "+env+" or run one at "+parsed.Host+"): "+err.Error())
	}
	c.Close()
	return u
}
