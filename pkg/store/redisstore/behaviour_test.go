package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/storetest"
)

// TestKeyLayout writes one of everything on a private Redis and checks every
// key against the layout in the package comment: name, type, TTL, and that
// nothing else was written.
func TestKeyLayout(t *testing.T) {
	t.Parallel()
	srv := testsvc.StartRedis(t)
	s := newStore(t, srv.URL(), Options{Prefix: "p:", MaxBlobBytes: 1 << 20})
	rdb := client(t, srv.URL())
	ctx := t.Context()

	if _, err := s.Claim(ctx, "k", "a1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutPart(ctx, store.Part{Device: "d", Conn: "c", ID: "f", Count: 2, Data: []byte("x")}, roomy); err != nil {
		t.Fatal(err)
	}
	if err := s.PutPrompt(ctx, store.PromptRecord{ID: "x", Device: "d", Expires: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	epoch, err := s.ClaimDevice(ctx, "d", "edge-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PushOutbox(ctx, "d", []byte("frame"), store.OutboxLimits{MaxItems: 10, MaxStoreBytes: 1 << 20, Share: "app", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	blob, err := s.PutBlob(ctx, []byte("media"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]string{
		"p:dedup:k":              "string",
		"p:uploads:{d}":          "hash",
		"p:upload:1:{d}:1:c:f":   "hash",
		"p:{prompts}:card:x":     "hash",
		"p:{prompts}:due":        "zset",
		"p:owner:{d}":            "string",
		"p:epoch:{d}":            "string",
		"p:outbox:{d}":           "list",
		"p:outboxseq:{d}":        "string",
		"p:outboxbytes:{d}":      "string",
		"p:{outbox}:deadlines":   "zset",
		"p:{outbox}:sum":         "string",
		"p:{outbox}:shares":      "zset",
		"p:{outbox}:devices:app": "zset",
		"p:{outbox}:order":       "zset",
		"p:{outbox}:share":       "hash",
		"p:blob:" + blob:         "string",
		"p:{blobs}:due":          "zset",
		"p:{blobs}:bytes":        "string",
	}
	all, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	var wantKeys []string
	for k := range want {
		wantKeys = append(wantKeys, k)
	}
	slices.Sort(wantKeys)
	if !slices.Equal(all, wantKeys) {
		t.Fatalf("keys\n%q\nwant\n%q", all, wantKeys)
	}
	for k, typ := range want {
		if got := rdb.Type(ctx, k).Val(); got != typ {
			t.Errorf("%s is a %s, want a %s", k, got, typ)
		}
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > time.Hour+time.Minute {
			t.Errorf("%s has TTL %v, want one of at most 1h1m", k, ttl)
		}
	}
	if got, want := rdb.Get(ctx, "p:owner:{d}").Val(), "edge-1|"+strconv.FormatInt(epoch, 10); got != want {
		t.Errorf("owner record %q, want %q", got, want)
	}
	seq := rdb.Get(ctx, "p:outboxseq:{d}").Val()
	if got := rdb.LIndex(ctx, "p:outbox:{d}", 0).Val(); !strings.HasPrefix(got, seq+"|") || !strings.HasSuffix(got, "|frame") {
		t.Errorf("outbox item %q, want %s|<deadline>|frame", got, seq)
	}
	if got := rdb.Get(ctx, "p:outboxbytes:{d}").Val(); got != "5" {
		t.Errorf("outbox bytes %q, want 5", got)
	}
	member := "5:" + seq + ":d"
	if got := rdb.ZRange(ctx, "p:{outbox}:deadlines", 0, -1).Val(); !slices.Equal(got, []string{member}) {
		t.Errorf("outbox accounting %q, want [%s]", got, member)
	}
	pad := strings.Repeat("0", 20-len(seq)) + seq
	for key, want := range map[string]string{
		"p:{outbox}:sum":         "5",
		"p:{outbox}:shares":      "[{5 app}]",
		"p:{outbox}:devices:app": "[{5 d}]",
		"p:{outbox}:order":       "[{0 3:app1:d" + pad + ":5}]",
		"p:{outbox}:share":       "map[" + member + ":app]",
	} {
		var got any
		switch rdb.Type(ctx, key).Val() {
		case "zset":
			got = rdb.ZRangeWithScores(ctx, key, 0, -1).Val()
		case "hash":
			got = rdb.HGetAll(ctx, key).Val()
		default:
			got = rdb.Get(ctx, key).Val()
		}
		if fmt.Sprint(got) != want {
			t.Errorf("%s = %v, want %s", key, got, want)
		}
	}
	if got := rdb.HGetAll(ctx, "p:uploads:{d}").Val(); fmt.Sprint(got) != "map[1:c:f:1]" {
		t.Errorf("uploads hash %v, want map[1:c:f:1]", got)
	}
}

// TestUploadExpiry checks that an upload lives UploadTTL after its last part
// and that the device's limits heal when one of its uploads expires while
// another keeps the device's accounting alive. Redis keeps the time: the
// test reads the TTLs each part sets and ends the idle upload's life itself
// (PEXPIRE, then waits until Redis has dropped it), so no step depends on
// how fast the machine runs.
func TestUploadExpiry(t *testing.T) {
	t.Parallel()
	const ttl = time.Hour
	url := sharedRedis(t)
	s := newStore(t, url, Options{UploadTTL: ttl})
	rdb := client(t, url)
	ctx := t.Context()
	lim := store.UploadLimits{MaxOpen: 2, MaxFileBytes: 100, MaxBytes: 100}
	put := func(id string, index int, data string) error {
		p := store.Part{Device: "dev", Conn: "c", ID: id, Index: index, Count: 20, Data: []byte(data)}
		up, err := s.PutPart(ctx, p, lim)
		if up != nil {
			t.Fatalf("PutPart(%s part %d) completed a file", id, index)
		}
		return err
	}
	wantBytes := func(want int) {
		t.Helper()
		if got, err := s.UploadBytes(ctx, "dev"); err != nil || got != want {
			t.Fatalf("UploadBytes = %d, %v; want %d", got, err, want)
		}
	}
	bufKey := func(id string) string { return s.uploadKeyPrefix("dev") + uploadName("c", id) }
	// wantTTL: key lives ttl from the part just written (a minute of slack
	// for a slow machine; the TTL was shortened below before each check).
	wantTTL := func(key string) {
		t.Helper()
		got, err := rdb.PTTL(ctx, key).Result()
		if err != nil || got <= ttl-time.Minute || got > ttl {
			t.Fatalf("PTTL %s = %v, %v; want about %v", key, got, err, ttl)
		}
	}

	if err := put("idle", 0, "zzzzzzzzzz"); err != nil {
		t.Fatal(err)
	}
	wantTTL(bufKey("idle"))
	for i := range 9 {
		// Each part restarts its upload's life and the device's accounting.
		if i > 0 {
			rdb.PExpire(ctx, bufKey("busy"), time.Minute)
			rdb.PExpire(ctx, s.uploadsKey("dev"), time.Minute)
		}
		if err := put("busy", i, "ab"); err != nil {
			t.Fatalf("busy part %d: %v", i, err)
		}
		wantTTL(bufKey("busy"))
		wantTTL(s.uploadsKey("dev"))
	}
	wantBytes(28)
	// The idle upload's life ends; Redis drops its buffer.
	if err := rdb.PExpire(ctx, bufKey("idle"), time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if !testsvc.Eventually(10*time.Second, func() bool { return rdb.Exists(ctx, bufKey("idle")).Val() == 0 }) {
		t.Fatal("Redis did not expire the idle upload's buffer")
	}
	wantBytes(18)
	if err := put("new", 0, "xyz"); err != nil {
		t.Fatalf("new upload after the idle one expired (MaxOpen 2): %v", err)
	}
	wantBytes(21)
	n, err := rdb.HLen(ctx, s.uploadsKey("dev")).Result()
	if err != nil || n != 2 {
		t.Fatalf("uploads hash has %d entries (%v), want busy and new", n, err)
	}
	// The limit still holds, and the expired upload starts over as a new one.
	if err := put("idle", 1, "z"); !errors.Is(err, store.ErrTooManyUploads) {
		t.Fatalf("part of the expired upload = %v, want ErrTooManyUploads (a third upload)", err)
	}
	wantBytes(21)
}

// TestReadEventsCutByContext: a waiting ReadEvents whose context ends while
// Redis has not answered (the server is stopped, so the socket deadline
// taken from the context fires, whichever timer is first) reports the
// context's error, not an unavailable store: the caller ended the wait.
func TestReadEventsCutByContext(t *testing.T) {
	t.Parallel()
	srv := testsvc.StartRedis(t)
	s := newStore(t, srv.URL(), Options{})
	last, err := s.AppendEvent(t.Context(), []byte("x"), 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer srv.Signal(syscall.SIGCONT)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	got, err := s.ReadEvents(ctx, last, 10, 10*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ReadEvents on a stopped Redis with a 300ms context = %v, %v; want only context.DeadlineExceeded", got, err)
	}
	// Without a wait the same cut is an unavailable store: Redis did not
	// answer a plain read in the time given.
	ctx2, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	if _, err := s.ReadEvents(ctx2, last, 10, 0); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ReadEvents (no wait) on a stopped Redis = %v; want store.ErrUnavailable", err)
	}
}

// TestMaxBlobBytes checks the bound on live blob bytes across Stores.
func TestMaxBlobBytes(t *testing.T) {
	t.Parallel()
	url := sharedRedis(t)
	prefix := testPrefix()
	s1 := newStore(t, url, Options{Prefix: prefix, MaxBlobBytes: 100})
	s2 := newStore(t, url, Options{Prefix: prefix, MaxBlobBytes: 100})
	ctx := t.Context()
	short, err := s1.PutBlob(ctx, fill('a', 60), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.PutBlob(ctx, fill('b', 40), time.Minute); err != nil {
		t.Fatalf("PutBlob up to exactly MaxBlobBytes: %v", err)
	}
	if _, err := s1.PutBlob(ctx, []byte("c"), time.Minute); !errors.Is(err, store.ErrFull) {
		t.Fatalf("PutBlob one byte over MaxBlobBytes (from another Store) = %v, want ErrFull", err)
	}
	if _, err := s2.PutBlob(ctx, nil, time.Minute); err != nil {
		t.Fatalf("PutBlob of nothing when full: %v", err)
	}
	// Once the 60 bytes expire, they no longer count.
	ok := testsvc.Eventually(5*time.Second, func() bool {
		_, err := s1.PutBlob(ctx, fill('d', 60), time.Minute)
		return err == nil
	})
	if !ok {
		t.Fatal("PutBlob still full after the 60-byte blob expired")
	}
	if _, err := s1.GetBlob(ctx, short); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetBlob(expired) = %v, want ErrNotFound", err)
	}
	if _, err := s2.PutBlob(ctx, []byte("e"), time.Minute); !errors.Is(err, store.ErrFull) {
		t.Fatalf("PutBlob over MaxBlobBytes = %v, want ErrFull", err)
	}
}

func fill(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }

// TestEpochWithoutEpochKey checks that epochs keep growing when the epoch key
// is gone (expired or evicted), with or without an owner record.
func TestEpochWithoutEpochKey(t *testing.T) {
	t.Parallel()
	url := sharedRedis(t)
	s := newStore(t, url, Options{})
	rdb := client(t, url)
	ctx := t.Context()
	e1, err := s.ClaimDevice(ctx, "dev", "edge-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// An epoch far ahead of the clock, as if many claims had raced.
	ahead := e1 + int64(time.Hour/time.Microsecond)
	rdb.Set(ctx, s.epochKey("dev"), ahead, time.Minute)
	e2, err := s.ClaimDevice(ctx, "dev", "edge-2", time.Minute)
	if err != nil || e2 != ahead+1 {
		t.Fatalf("ClaimDevice = %d, %v; want %d", e2, err, ahead+1)
	}
	// The epoch key is lost, the owner record stays: above the owner's epoch.
	rdb.Del(ctx, s.epochKey("dev"))
	e3, err := s.ClaimDevice(ctx, "dev", "edge-3", time.Minute)
	if err != nil || e3 <= e2 {
		t.Fatalf("ClaimDevice without the epoch key = %d, %v; want more than %d", e3, err, e2)
	}
	// Both are lost: the clock, in µs, is above every earlier normal epoch.
	rdb.Del(ctx, s.epochKey("dev"), s.ownerKey("dev"))
	e4, err := s.ClaimDevice(ctx, "dev", "edge-4", time.Minute)
	if err != nil || e4 <= e1 {
		t.Fatalf("ClaimDevice with nothing left = %d, %v; want more than %d", e4, err, e1)
	}
	if lost, err := s.RefreshDevices(ctx, map[string]int64{"dev": e4}, time.Minute); err != nil || len(lost) != 0 {
		t.Fatalf("RefreshDevices(current epoch) = %v, %v", lost, err)
	}
}

// TestScriptCacheFlushed checks that every kind of call survives a Redis
// that forgot the scripts, including RefreshDevices' pipelines, which it
// tries with many devices to span several of them.
func TestScriptCacheFlushed(t *testing.T) {
	t.Parallel()
	srv := testsvc.StartRedis(t)
	s := newStore(t, srv.URL(), Options{})
	rdb := client(t, srv.URL())
	ctx := t.Context()
	owned := map[string]int64{}
	var want []string
	for i := range 2*refreshBatch + 10 {
		dev := fmt.Sprint("dev", i)
		e, err := s.ClaimDevice(ctx, dev, "edge-1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		owned[dev] = e
		if i%100 == 7 {
			owned[dev] = e - 1 // a stale epoch: lost
			want = append(want, dev)
		}
	}
	slices.Sort(want)
	for range 2 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		lost, err := s.RefreshDevices(ctx, owned, time.Minute)
		if err != nil {
			t.Fatalf("RefreshDevices after SCRIPT FLUSH: %v", err)
		}
		if !slices.Equal(lost, want) {
			t.Fatalf("RefreshDevices lost %q, want %q", lost, want)
		}
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Claim(ctx, "k", "a", time.Minute); err != nil || !ok {
		t.Fatalf("Claim after SCRIPT FLUSH = %v, %v", ok, err)
	}
	// AddUsage: the owners' calls run again once, none of them twice.
	for range 2 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.AddUsage(ctx, map[string]store.UsageCounts{"acme": {"messages_in": 1}, "beta": {"messages_in": 2}}, time.Now(), time.Minute); err != nil {
			t.Fatalf("AddUsage after SCRIPT FLUSH: %v", err)
		}
	}
	for owner, want := range map[string]int64{"acme": 2, "beta": 4} {
		if got, _, err := s.Usage(ctx, owner); err != nil || got["messages_in"] != want {
			t.Fatalf("%s's usage after two adds across SCRIPT FLUSH = %v, %v; want messages_in %d", owner, got, err, want)
		}
	}
}

// TestOutOfMemory checks that a Redis at maxmemory makes writes fail with
// ErrFull and ErrUnavailable, and that reads still work.
func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	srv := testsvc.StartRedis(t)
	s := newStore(t, srv.URL(), Options{})
	rdb := client(t, srv.URL())
	ctx := t.Context()
	key, err := s.PutBlob(ctx, []byte("before"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBlob(ctx, []byte("after"), time.Minute); !errors.Is(err, store.ErrFull) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("PutBlob at maxmemory = %v, want ErrFull and ErrUnavailable", err)
	}
	if _, err := s.Claim(ctx, "k", "a", time.Minute); !errors.Is(err, store.ErrFull) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Claim at maxmemory = %v, want ErrFull and ErrUnavailable", err)
	}
	if got, err := s.GetBlob(ctx, key); err != nil || string(got) != "before" {
		t.Fatalf("GetBlob at maxmemory = %q, %v", got, err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBlob(ctx, []byte("after"), time.Minute); err != nil {
		t.Fatalf("PutBlob once memory is back: %v", err)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	t.Run("Unreachable", func(t *testing.T) {
		port, err := testsvc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		start := time.Now()
		s, err := New(cctx, Options{URL: "redis://127.0.0.1:" + strconv.Itoa(port)})
		if !errors.Is(err, store.ErrUnavailable) || s != nil {
			t.Fatalf("New(nothing listening) = %v, %v; want ErrUnavailable", s, err)
		}
		if took := time.Since(start); took > testsvc.Slack(2*time.Second) {
			t.Fatalf("New(nothing listening) took %v", took)
		}
	})
	t.Run("BadOptions", func(t *testing.T) {
		for _, opts := range []Options{
			{},
			{URL: "http://127.0.0.1:6379"},
			{URL: "redis://127.0.0.1:6379", Prefix: "a{b}:"},
		} {
			if s, err := New(ctx, opts); err == nil || errors.Is(err, store.ErrUnavailable) {
				t.Errorf("New(%+v) = %v, %v; want a configuration error", opts, s, err)
			}
		}
	})
	t.Run("CanceledContext", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := New(cctx, Options{URL: sharedRedis(t)}); !errors.Is(err, context.Canceled) {
			t.Fatalf("New(canceled) = %v, want context.Canceled", err)
		}
	})
	t.Run("ClientOptions", func(t *testing.T) {
		// go-redis stores "no retries" (-1) as 0 once the client is made.
		for url, retries := range map[string]int{"": 0, "?max_retries=2": 2} {
			s := newStore(t, sharedRedis(t)+url, Options{})
			o := s.rdb.(*redis.Client).Options()
			if o.MaxRetries != retries || o.DialerRetries != 1 || !o.ContextTimeoutEnabled {
				t.Errorf("New(%q) made a client with MaxRetries %d, DialerRetries %d, ContextTimeoutEnabled %v; want %d, 1, true",
					url, o.MaxRetries, o.DialerRetries, o.ContextTimeoutEnabled, retries)
			}
		}
	})
	t.Run("ClientKeptOpen", func(t *testing.T) {
		rdb := client(t, sharedRedis(t))
		s, err := New(ctx, Options{Client: rdb, Prefix: testPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatalf("the caller's client after Close: %v", err)
		}
	})
	t.Run("CloseTwice", func(t *testing.T) {
		s, err := New(ctx, Options{URL: sharedRedis(t), Prefix: testPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := s.Seen(ctx, "k"); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Seen after Close = %v, want ErrUnavailable", err)
		}
	})
}

func TestNonPositiveTTL(t *testing.T) {
	t.Parallel()
	s := newStore(t, sharedRedis(t), Options{})
	ctx := t.Context()
	for name, call := range map[string]func() error{
		"Claim":          func() error { _, err := s.Claim(ctx, "k", "a", 0); return err },
		"ClaimDevice":    func() error { _, err := s.ClaimDevice(ctx, "d", "e", -time.Second); return err },
		"RefreshDevices": func() error { _, err := s.RefreshDevices(ctx, nil, 0); return err },
		"PushOutbox": func() error {
			_, err := s.PushOutbox(ctx, "d", nil, store.OutboxLimits{MaxItems: 1, TTL: 0})
			return err
		},
		"PutBlob": func() error { _, err := s.PutBlob(ctx, nil, 0); return err },
	} {
		if err := call(); !errors.Is(err, errBadTTL) {
			t.Errorf("%s with ttl <= 0 = %v, want errBadTTL", name, err)
		}
	}
	if ok, err := s.Seen(ctx, "k"); ok || err != nil {
		t.Errorf("Seen after a Claim with ttl 0 = %v, %v", ok, err)
	}
}

// TestUploadNames checks that connection and file ids cannot be confused by
// their separators.
func TestUploadNames(t *testing.T) {
	t.Parallel()
	s := newStore(t, sharedRedis(t), Options{})
	ctx := t.Context()
	a := store.Part{Device: "dev", Conn: "a:b", ID: "c", Count: 2, Data: []byte("1")}
	b := store.Part{Device: "dev", Conn: "a", ID: "b:c", Count: 2, Data: []byte("2")}
	for _, p := range []store.Part{a, b} {
		if up, err := s.PutPart(ctx, p, roomy); up != nil || err != nil {
			t.Fatalf("PutPart(%q, %q) = %v, %v", p.Conn, p.ID, up, err)
		}
	}
	if err := s.DropUploads(ctx, "dev", "a"); err != nil {
		t.Fatal(err)
	}
	a.Index, a.Data = 1, []byte("!")
	up, err := s.PutPart(ctx, a, roomy)
	if err != nil || up == nil || string(up.Data) != "1!" {
		t.Fatalf("PutPart completing conn a:b's upload = %+v, %v; want 1!", up, err)
	}
	if n, err := s.UploadBytes(ctx, "dev"); n != 0 || err != nil {
		t.Fatalf("UploadBytes = %d, %v; want 0 (conn a's upload dropped)", n, err)
	}
}

// TestJournalSeqAfterForgotten checks that a journal forgotten whole (a
// Redis restart without persistence) starts its Seqs above those it had:
// a router that handled the old head and asks for the next entry with it
// as done, once the new journal names it owner again, must not remove the
// new head unhandled.
func TestJournalSeqAfterForgotten(t *testing.T) {
	t.Parallel()
	url := sharedRedis(t)
	s := newStore(t, url, Options{})
	rdb := client(t, url)
	ctx := t.Context()
	lim := store.JournalLimits{MaxLen: 10, Lease: time.Minute, TTL: time.Minute}
	dev := "dev-forgotten"
	if _, err := s.AppendJournal(ctx, dev, "r1", []byte("old"), lim); err != nil {
		t.Fatal(err)
	}
	old, ok, err := s.NextJournal(ctx, dev, "r1", 0, time.Minute)
	if err != nil || !ok || string(old.Data) != "old" {
		t.Fatalf("NextJournal = %+v, %v, %v", old, ok, err)
	}
	keys := s.journalKeys(dev)
	if err := rdb.Del(ctx, keys[0], keys[1]).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendJournal(ctx, dev, "r1", []byte("new"), lim); err != nil {
		t.Fatal(err)
	}
	e, ok, err := s.NextJournal(ctx, dev, "r1", old.Seq, time.Minute)
	if err != nil || !ok || string(e.Data) != "new" {
		t.Fatalf("NextJournal(done = the forgotten head %d) = %+v, %v, %v; want the new entry", old.Seq, e, ok, err)
	}
	if e.Seq <= old.Seq {
		t.Fatalf("the new journal's first Seq is %d, want more than the forgotten %d", e.Seq, old.Seq)
	}
	// The Seqs that follow count on from the first, exactly.
	if _, err := s.AppendJournal(ctx, dev, "r1", []byte("next"), lim); err != nil {
		t.Fatal(err)
	}
	n, ok, err := s.NextJournal(ctx, dev, "r1", e.Seq, time.Minute)
	if err != nil || !ok || string(n.Data) != "next" || n.Seq != e.Seq+1 {
		t.Fatalf("NextJournal(done %d) = %+v, %v, %v; want \"next\" at Seq %d", e.Seq, n, ok, err, e.Seq+1)
	}
}

// TestOutboxStoreBound: the store-wide outbox bound at its boundary, on one
// server (one shard of accounting).
func TestOutboxStoreBound(t *testing.T) {
	t.Parallel()
	s := newStore(t, testsvc.StartRedis(t).URL(), Options{})
	storetest.OutboxStoreBound(t, s, storetest.Pool{})
}
