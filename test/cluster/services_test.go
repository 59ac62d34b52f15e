//go:build unix

package cluster

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"

	"github.com/redis/go-redis/v9"
)

// shared holds the services of the whole package.
var shared struct {
	redisOnce sync.Once
	redisURL  string
	redisErr  string          // why there is no Redis
	redis     *testsvc.Server // started here, stopped by TestMain

	// natsMu lets one test at a time use a NATS it does not own.
	natsMu sync.Mutex
}

// unavailable skips the test, or fails it when CI is set.
func unavailable(t *testing.T, what, how string) {
	t.Helper()
	testsvc.Missing(t, what+" is not available: "+how)
}

// redisURL returns the Redis of the package: REDIS_URL, 127.0.0.1:6379, or a
// redis-server started from PATH.
func redisURL(t *testing.T) string {
	t.Helper()
	shared.redisOnce.Do(findRedis)
	if shared.redisErr != "" {
		unavailable(t, "Redis", shared.redisErr)
	}
	return shared.redisURL
}

func findRedis() {
	if u := os.Getenv("REDIS_URL"); u != "" {
		if err := reachable(u); err != nil {
			shared.redisErr = fmt.Sprintf("REDIS_URL=%s does not answer: %v", u, err)
			return
		}
		shared.redisURL = u
		return
	}
	if reachable("redis://127.0.0.1:6379") == nil {
		shared.redisURL = "redis://127.0.0.1:6379"
		return
	}
	bin := findBinary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
	if bin == "" {
		shared.redisErr = "set REDIS_URL, run Redis on 127.0.0.1:6379, or put redis-server on PATH (apt-get install redis-server)"
		return
	}
	srv, err := testsvc.NewRedis(os.TempDir()) // it writes nothing there: no persistence
	if err != nil {
		shared.redisErr = "starting " + bin + " failed: " + err.Error()
		return
	}
	shared.redis, shared.redisURL = srv, srv.URL()
}

// stopSharedServices stops what the package started.
func stopSharedServices() {
	if shared.redis != nil {
		shared.redis.Kill()
	}
}

// natsURL returns a NATS for one test: a nats-server of its own when there
// is one on PATH (see the package comment for why), else NATS_URL or
// 127.0.0.1:4222, which the test then holds alone until it ends.
func natsURL(t *testing.T) string {
	t.Helper()
	if bin := findBinary("nats-server", "/usr/sbin/nats-server", "/usr/local/bin/nats-server"); bin != "" {
		return startNATS(t, bin)
	}
	u := os.Getenv("NATS_URL")
	if u == "" {
		u = "nats://127.0.0.1:4222"
	}
	if err := reachable(u); err != nil {
		unavailable(t, "NATS", fmt.Sprintf("put nats-server on PATH (apt-get install nats-server), set NATS_URL or run NATS on 127.0.0.1:4222 (%s: %v)", u, err))
	}
	t.Logf("no nats-server binary: using the shared NATS at %s, one test at a time; routers of other clusters on it would take this test's events", u)
	shared.natsMu.Lock()
	t.Cleanup(shared.natsMu.Unlock)
	return u
}

var natsListening = regexp.MustCompile(`Listening for client connections on (\S+)`)

// startNATS runs a nats-server on a random loopback port for the test.
func startNATS(t *testing.T, bin string) string {
	t.Helper()
	var addr string
	_, _ = testsvc.StartProc(t, "nats", bin, []string{"-a", "127.0.0.1", "-p", "-1"}, nil, func(line string) (string, bool) {
		if m := natsListening.FindStringSubmatch(line); m != nil {
			addr = m[1]
		}
		return "", addr != "" && strings.Contains(line, "Server is ready")
	})
	return "nats://" + addr
}

// findBinary looks name up on PATH, then at the given paths.
func findBinary(name string, paths ...string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// reachable dials the host of a redis:// or nats:// URL.
func reachable(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	host := u.Host
	if u.Port() == "" {
		switch u.Scheme {
		case "redis", "rediss":
			host = net.JoinHostPort(u.Hostname(), "6379")
		default:
			host = net.JoinHostPort(u.Hostname(), "4222")
		}
	}
	c, err := net.DialTimeout("tcp", host, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// dropRedisKeys deletes every key under prefix when the test ends.
func dropRedisKeys(t *testing.T, redisURL, prefix string) {
	t.Cleanup(func() {
		opts, err := redis.ParseURL(redisURL)
		if err != nil {
			t.Logf("cleaning Redis: %v", err)
			return
		}
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Logf("cleaning Redis: %v", err)
			return
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			if err := rdb.Unlink(ctx, keys[:n]...).Err(); err != nil {
				t.Logf("cleaning Redis: %v", err)
				return
			}
			keys = keys[n:]
		}
	})
}
