package redisstore

import (
	"bufio"
	"context"
	"errors"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// samples scrapes tel's /metrics in process: sample name{labels} → value.
func samples(t *testing.T, tel *telemetry.Telemetry) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	out := make(map[string]float64)
	sc := bufio.NewScanner(rec.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("unreadable sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func redisErrors(kind string) string { return `hermes_redis_errors_total{kind="` + kind + `"}` }

// TestTelemetry: a Store with Telemetry reports its pool (hits and misses
// as commands run, connections open and idle, a wait for a connection that
// timed out) and counts the operations Redis failed by kind, but not one
// its caller gave up on; each command is a span without its arguments; a
// closed Store reports no pool any more.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	srv := privateRedis(t)
	spans := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{SpanProcessor: spans})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	// One connection, so that a second caller waits for it; not long.
	s := newStore(t, srv.url()+"?pool_size=1&pool_timeout=200ms", Options{Telemetry: tel})
	rdb := client(t, srv.url())
	ctx := t.Context()

	fresh := samples(t, tel)
	for _, kind := range []string{telemetry.RedisUnavailable, telemetry.RedisFull, telemetry.RedisReply} {
		if v, ok := fresh[redisErrors(kind)]; !ok || v != 0 {
			t.Errorf("fresh Store: %s = %v (present %v), want 0", redisErrors(kind), v, ok)
		}
	}
	if fresh["hermes_redis_pool_connections"] != 1 || fresh["hermes_redis_pool_idle_connections"] != 1 {
		t.Errorf("after New's PING: %v connections, %v idle; want 1 and 1",
			fresh["hermes_redis_pool_connections"], fresh["hermes_redis_pool_idle_connections"])
	}

	const secret = "a-message-text-no-span-may-carry"
	if _, err := s.Claim(ctx, secret, "attempt", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBlob(ctx, []byte(secret), time.Minute); err != nil {
		t.Fatal(err)
	}
	m := samples(t, tel)
	if used := m["hermes_redis_pool_hits_total"] + m["hermes_redis_pool_misses_total"]; used < fresh["hermes_redis_pool_hits_total"]+fresh["hermes_redis_pool_misses_total"]+2 {
		t.Errorf("two commands later hits+misses = %v, was %v", used, fresh["hermes_redis_pool_hits_total"]+fresh["hermes_redis_pool_misses_total"])
	}

	// reply: a key of the wrong type.
	if err := rdb.LPush(ctx, s.dedupKey("wrong"), "x").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seen(ctx, "wrong"); err == nil || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Seen of a list = %v, want a reply error", err)
	}
	// full: maxmemory reached.
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBlob(ctx, []byte("more"), time.Minute); !errors.Is(err, store.ErrFull) {
		t.Fatalf("PutBlob at maxmemory = %v, want ErrFull", err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// unavailable: the only connection is taken by a blocking read, so the
	// next call times out waiting for the pool.
	read := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := s.ReadEvents(rctx, "", 1, 2*time.Second)
		read <- err
	}()
	if !eventually(5*time.Second, func() bool { return samples(t, tel)["hermes_redis_pool_idle_connections"] == 0 }) {
		t.Fatal("the blocking read did not take the pool's connection")
	}
	if _, err := s.Seen(ctx, "k"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Seen with the pool's connection busy = %v, want ErrUnavailable", err)
	}
	if err := <-read; err != nil {
		t.Fatalf("the blocking read: %v", err)
	}
	// Not counted: a call its caller cancels while Redis does not answer.
	if err := srv.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = s.Seen(cctx, "k")
	srv.signal(syscall.SIGCONT)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Seen canceled while Redis is stopped = %v, want context.Canceled", err)
	}

	m = samples(t, tel)
	for sample, want := range map[string]float64{
		redisErrors(telemetry.RedisReply):       1,
		redisErrors(telemetry.RedisFull):        1,
		redisErrors(telemetry.RedisUnavailable): 1,
		"hermes_redis_pool_timeouts_total":      1,
	} {
		if m[sample] != want {
			t.Errorf("%s = %v, want %v", sample, m[sample], want)
		}
	}

	var names []string
	for _, span := range spans.Ended() {
		names = append(names, span.Name())
		for _, a := range span.Attributes() {
			if a.Key == "db.statement" || strings.Contains(a.Value.String(), secret) {
				t.Errorf("span %s carries %s=%s", span.Name(), a.Key, a.Value.String())
			}
		}
	}
	if !strings.Contains(strings.Join(names, " "), "evalsha") {
		t.Errorf("no span of the scripts' EVALSHA among %q", names)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := samples(t, tel)["hermes_redis_pool_connections"]; ok {
		t.Error("a closed Store still reports its pool")
	}
}
