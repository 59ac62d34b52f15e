package redisstore

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

func redisErrors(kind string) string { return `hermes_redis_errors_total{kind="` + kind + `"}` }

// TestTelemetry: a Store with Telemetry reports its pool (hits and misses
// as commands run, connections open and idle, a wait for a connection that
// timed out) and counts the operations Redis failed by kind, but not one
// its caller gave up on; each command is a span without its arguments; a
// closed Store reports no pool any more.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	srv := testsvc.StartRedis(t)
	spans := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{SpanProcessor: spans})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	// One connection, so that a second caller waits for it; not long.
	s := newStore(t, srv.URL()+"?pool_size=1&pool_timeout=200ms", Options{Telemetry: tel})
	rdb := client(t, srv.URL())
	ctx := t.Context()

	fresh := testsvc.Samples(t, tel.Handler())
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
	m := testsvc.Samples(t, tel.Handler())
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
	if !testsvc.Eventually(5*time.Second, func() bool { return testsvc.Samples(t, tel.Handler())["hermes_redis_pool_idle_connections"] == 0 }) {
		t.Fatal("the blocking read did not take the pool's connection")
	}
	if _, err := s.Seen(ctx, "k"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Seen with the pool's connection busy = %v, want ErrUnavailable", err)
	}
	if err := <-read; err != nil {
		t.Fatalf("the blocking read: %v", err)
	}
	// Not counted: a call its caller cancels while Redis does not answer.
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = s.Seen(cctx, "k")
	srv.Signal(syscall.SIGCONT)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Seen canceled while Redis is stopped = %v, want context.Canceled", err)
	}

	m = testsvc.Samples(t, tel.Handler())
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
	if _, ok := testsvc.Samples(t, tel.Handler())["hermes_redis_pool_connections"]; ok {
		t.Error("a closed Store still reports its pool")
	}
}

// TestOutboxAndCommandMetrics: a fresh Store serves
// hermes_outbox_dropped_total at 0 for both reasons and has timed its
// start-up PING in hermes_redis_command_duration_seconds; a push past an
// outbox's most counts the item it pushed out as full and the length it
// left, and items that expired unwritten count as expired, whether a push
// or an acknowledgement removes them.
func TestOutboxAndCommandMetrics(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	s := newStore(t, sharedRedis(t), Options{Telemetry: tel})
	ctx := t.Context()
	full, expired := `hermes_outbox_dropped_total{reason="full"}`, `hermes_outbox_dropped_total{reason="expired"}`

	fresh := testsvc.Samples(t, tel.Handler())
	for _, name := range []string{full, expired} {
		if v, ok := fresh[name]; !ok || v != 0 {
			t.Errorf("fresh Store: %s = %v (present %v), want 0", name, v, ok)
		}
	}
	if n := fresh["hermes_redis_command_duration_seconds_count"]; n < 1 {
		t.Errorf("fresh Store: hermes_redis_command_duration_seconds_count = %v, want New's PING", n)
	}

	for _, item := range []string{"a", "b", "c"} {
		if _, err := s.PushOutbox(ctx, "d1", []byte(item), store.OutboxLimits{MaxItems: 2, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	m := testsvc.Samples(t, tel.Handler())
	if m[full] != 1 || m[expired] != 0 {
		t.Errorf("three pushes into an outbox of 2: full %v, expired %v; want 1 and 0", m[full], m[expired])
	}
	if m["hermes_outbox_length_count"] != 3 || m["hermes_outbox_length_sum"] != 1+2+2 {
		t.Errorf("outbox lengths: count %v, sum %v; want 3 pushes leaving 1, 2, 2",
			m["hermes_outbox_length_count"], m["hermes_outbox_length_sum"])
	}
	if m["hermes_redis_command_duration_seconds_count"] < fresh["hermes_redis_command_duration_seconds_count"]+3 {
		t.Errorf("three pushes later hermes_redis_command_duration_seconds_count = %v, was %v",
			m["hermes_redis_command_duration_seconds_count"], fresh["hermes_redis_command_duration_seconds_count"])
	}

	// Expired: an item whose TTL passes unwritten behind a newer one (which
	// keeps the outbox's key), removed by the next push; another, removed
	// by an acknowledgement of nothing. (An outbox whose every item expired
	// vanishes with its key, uncounted.)
	only := func(device, want string) bool {
		items, err := s.PeekOutbox(ctx, device, 0)
		return err == nil && len(items) == 1 && string(items[0].Data) == want
	}
	epoch, err := s.ClaimDevice(ctx, "d3", "edge-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, device := range []string{"d2", "d3"} {
		if _, err := s.PushOutbox(ctx, device, []byte("old"), store.OutboxLimits{MaxItems: 10, TTL: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PushOutbox(ctx, device, []byte("new"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if !testsvc.Eventually(5*time.Second, func() bool { return only("d2", "new") && only("d3", "new") }) {
		t.Fatal("the old items did not expire")
	}
	if m := testsvc.Samples(t, tel.Handler()); m[expired] != 0 {
		t.Errorf("before any push or ack removed them: expired %v, want 0", m[expired])
	}
	if _, err := s.PushOutbox(ctx, "d2", []byte("z"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AckOutbox(ctx, "d3", epoch, 0); err != nil || !ok {
		t.Fatalf("AckOutbox = %v, %v", ok, err)
	}
	m = testsvc.Samples(t, tel.Handler())
	if m[full] != 1 || m[expired] != 2 {
		t.Errorf("after two items expired: full %v, expired %v; want 1 and 2", m[full], m[expired])
	}
}

// TestPoolSize: the pool holds Options.PoolSize connections, or
// DefaultPoolSize (not go-redis's 10 per CPU), and a pool_size in the URL
// wins over both.
func TestPoolSize(t *testing.T) {
	t.Parallel()
	url := sharedRedis(t)
	for _, tc := range []struct {
		url  string
		size int
		want int
	}{
		{url, 0, DefaultPoolSize},
		{url, 7, 7},
		{url + "?pool_size=3", 7, 3},
	} {
		s := newStore(t, tc.url, Options{PoolSize: tc.size})
		if got := s.PoolSize(); got != tc.want {
			t.Errorf("URL %s, PoolSize %d: the client's pool size is %d, want %d", tc.url, tc.size, got, tc.want)
		}
	}
}
