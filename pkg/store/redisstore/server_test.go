package redisstore

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/hermes-mobile/gateway/internal/testsvc"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	srv  *redisServer // started by sharedRedis; nil when the Redis was found
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.stop()
		os.RemoveAll(shared.srv.dir)
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
		if ping("127.0.0.1:6379") == nil {
			shared.url = "redis://127.0.0.1:6379"
			return
		}
		dir, err := os.MkdirTemp("", "redisstore-test-")
		if err != nil {
			shared.err = err
			return
		}
		shared.srv, shared.err = startRedis(0, dir)
		if shared.err != nil {
			os.RemoveAll(dir)
			return
		}
		shared.url = shared.srv.url()
	})
	if shared.err != nil {
		noRedis(t, shared.err.Error())
	}
	return shared.url
}

// privateRedis starts a redis-server that only t uses, stopped when t ends.
func privateRedis(t *testing.T) *redisServer {
	t.Helper()
	srv, err := startRedis(0, t.TempDir())
	if err != nil {
		noRedis(t, err.Error())
	}
	t.Cleanup(func() {
		srv.stop()
		if t.Failed() {
			t.Logf("redis-server output:\n%s", srv.out.String())
		}
	})
	return srv
}

// redisServer is a redis-server child process without persistence.
type redisServer struct {
	port int
	dir  string
	cmd  *exec.Cmd
	out  *testsvc.Buffer
}

// startRedis starts redis-server on port (a free one when 0) and waits until
// it answers PING.
func startRedis(port int, dir string) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	if port == 0 {
		if port, err = testsvc.FreePort(); err != nil {
			return nil, err
		}
	}
	srv := &redisServer{port: port, dir: dir, out: new(testsvc.Buffer)}
	srv.cmd = exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	srv.cmd.Stdout, srv.cmd.Stderr = srv.out, srv.out
	if err := srv.cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := ping(srv.addr())
		if err == nil {
			return srv, nil
		}
		if time.Now().After(deadline) {
			srv.stop()
			return nil, fmt.Errorf("redis-server on port %d: %w; output:\n%s", port, err, srv.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }
func (s *redisServer) url() string  { return "redis://" + s.addr() }

// stop kills the server and waits for it. It is idempotent.
func (s *redisServer) stop() {
	if s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// signal sends sig to the running server.
func (s *redisServer) signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }

// restart starts the stopped server again on its port.
func (s *redisServer) restart() error {
	s.stop()
	srv, err := startRedis(s.port, s.dir)
	if err != nil {
		return err
	}
	*s = *srv
	return nil
}

// ping sends PING to addr and checks the reply, without a client library.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING: %q", strings.TrimSpace(line))
	}
	return nil
}

// testPrefix returns a key prefix that no other test run uses.
func testPrefix() string {
	var b [6]byte
	rand.Read(b[:])
	return "hermes-test:" + hex.EncodeToString(b[:]) + ":"
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

// eventually polls cond every 20 ms until it holds or wait passes.
func eventually(wait time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
