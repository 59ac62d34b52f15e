package push_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// counts is push.Metrics for the tests.
type counts struct {
	sent, failed, dropped atomic.Int64
	forgotten             sync.Map // kind → *atomic.Int64
}

func (c *counts) PushSent()    { c.sent.Add(1) }
func (c *counts) PushFailed()  { c.failed.Add(1) }
func (c *counts) PushDropped() { c.dropped.Add(1) }
func (c *counts) PushForgotten(kind string) {
	n, _ := c.forgotten.LoadOrStore(kind, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

// forgot is how many registrations of kind were forgotten.
func (c *counts) forgot(kind string) int64 {
	if n, ok := c.forgotten.Load(kind); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// loopback is the policy of the tests: their endpoints listen on
// 127.0.0.1, which the default policy refuses.
var loopback = push.Policy{AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}

// sleeps is a Config.Sleep that records the waits and returns at once.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) bool {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err() == nil
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// endpoint is a loopback push endpoint that records what it receives.
type endpoint struct {
	*httptest.Server
	mu      sync.Mutex
	got     []request
	status  func(n int) int                    // the answer to the n-th request (from 1); nil: 200
	respond func(n int, w http.ResponseWriter) // or this writes it
}

type request struct {
	path   string
	header http.Header
	body   []byte
}

func newEndpoint(t *testing.T) *endpoint {
	e := &endpoint{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.got = append(e.got, request{r.URL.Path, r.Header.Clone(), body})
		n := len(e.got)
		e.mu.Unlock()
		switch {
		case e.respond != nil:
			e.respond(n, w)
		case e.status != nil:
			w.WriteHeader(e.status(n))
		}
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *endpoint) requests() []request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]request(nil), e.got...)
}

func (e *endpoint) waitFor(t *testing.T, n int) []request {
	t.Helper()
	testsvc.WaitFor(t, 10*time.Second, "push requests", func() bool { return len(e.requests()) >= n })
	return e.requests()
}

func register(t *testing.T, s store.Store, device string, target push.Target) {
	t.Helper()
	if err := target.Validate(); err != nil {
		t.Fatalf("target %+v: %v", target, err)
	}
	data, _ := json.Marshal(target)
	if err := s.SetPushTarget(t.Context(), device, data, push.TargetTTL); err != nil {
		t.Fatal(err)
	}
}

// TestPushOncePerBurst: a burst of output for a sleeping device sends one
// signed webhook notification, without the message's text; the next burst,
// once PushEvery has passed, sends one more. A device without a target
// gets none.
func TestPushOncePerBurst(t *testing.T) {
	clk := clock.NewFake(time.Now())
	s := memstore.New(memstore.Options{Clock: clk})
	t.Cleanup(func() { s.Close() })
	hook, sentinel := newEndpoint(t), newEndpoint(t)
	key := []byte("push-key")
	register(t, s, "tel-1", push.Target{Kind: push.KindWebhook, URL: hook.URL + "/hook"})
	var m counts
	// Notifications are taken up (their bursts claimed) in order, so the
	// sentinel's arrival means every one before it was taken up; the
	// count of those sent says when their requests are over.
	n := push.New(push.Config{Store: s, Key: key, Every: 15 * time.Minute, Workers: 1, Metrics: &m, Policy: loopback})
	t.Cleanup(n.Close)

	// Each round has a sentinel device of its own (a device's second
	// notification within 15 min would be coalesced away).
	burst := func(round int, sent int64) {
		sentinelDev := "tel-sentinel-" + string(rune('0'+round))
		register(t, s, sentinelDev, push.Target{Kind: push.KindWebhook, URL: sentinel.URL})
		for range 5 {
			n.Notify("tel-1", "message", "the secret answer")
		}
		n.Notify("tel-nobody", "message", "x")
		n.Notify(sentinelDev, "message", "x")
		sentinel.waitFor(t, round)
		testsvc.WaitFor(t, 10*time.Second, "notifications sent", func() bool { return m.sent.Load() >= sent })
	}
	burst(1, 2)
	got := hook.requests()
	if len(got) != 1 {
		t.Fatalf("a burst of 5 outputs sent %d notifications, want 1", len(got))
	}
	r := got[0]
	if !push.Verify(key, r.body, r.header.Get(push.SignatureHeader)) {
		t.Fatalf("signature %q does not verify body %s", r.header.Get(push.SignatureHeader), r.body)
	}
	if want := push.Sign(key, r.body); !regexp.MustCompile(`^sha256=[0-9a-f]{64}$`).MatchString(want) || r.header.Get(push.SignatureHeader) != want {
		t.Fatalf("signature header %q, want sha256=<hex HMAC>", r.header.Get(push.SignatureHeader))
	}
	var nt push.Notice
	if err := json.Unmarshal(r.body, &nt); err != nil || nt.Device != "tel-1" || nt.What != "message" {
		t.Fatalf("notice %s (%v), want tel-1's message", r.body, err)
	}
	if strings.Contains(string(r.body), "secret") || nt.Text != "" {
		t.Fatalf("notice %s carries the message's text without MOBILE_PUSH_CONTENT", r.body)
	}

	clk.Advance(15*time.Minute - time.Millisecond)
	burst(2, 3)
	if got := len(hook.requests()); got != 1 {
		t.Fatalf("a second burst within 15 min sent %d notifications in all, want 1", got)
	}
	clk.Advance(time.Millisecond)
	burst(3, 5)
	if got := len(hook.requests()); got != 2 {
		t.Fatalf("a burst after 15 min sent %d notifications in all, want 2", got)
	}
	if m.sent.Load() != 5 || m.failed.Load() != 0 || m.dropped.Load() != 0 {
		t.Fatalf("metrics sent %d failed %d dropped %d; want 5 (2 + 3 sentinel), 0, 0", m.sent.Load(), m.failed.Load(), m.dropped.Load())
	}
}

// TestPushContent: with Content the notice carries the message's text.
func TestPushContent(t *testing.T) {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { s.Close() })
	hook := newEndpoint(t)
	register(t, s, "tel-1", push.Target{Kind: push.KindUnifiedPush, URL: hook.URL + "/up/abc?x=1"})
	n := push.New(push.Config{Store: s, Content: true, Policy: loopback})
	t.Cleanup(n.Close)
	n.Notify("tel-1", "message", "the answer")
	r := hook.waitFor(t, 1)[0]
	var nt push.Notice
	if err := json.Unmarshal(r.body, &nt); err != nil || nt.Text != "the answer" {
		t.Fatalf("notice %s (%v), want the text", r.body, err)
	}
	if r.path != "/up/abc" || r.header.Get(push.SignatureHeader) != "" {
		t.Fatalf("UnifiedPush request to %s with signature %q; want the endpoint URL, unsigned", r.path, r.header.Get(push.SignatureHeader))
	}
}

// TestPushRetries: an endpoint that answers 503 twice gets the notification
// on the third attempt; one that answers 404 is given up at once, and the
// burst's claim is released, so the next output tries again.
func TestPushRetries(t *testing.T) {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { s.Close() })
	flaky, gone := newEndpoint(t), newEndpoint(t)
	flaky.status = func(n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	gone.status = func(int) int { return http.StatusNotFound }
	register(t, s, "tel-flaky", push.Target{Kind: push.KindWebhook, URL: flaky.URL})
	register(t, s, "tel-gone", push.Target{Kind: push.KindWebhook, URL: gone.URL})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, Sleep: waits.sleep})
	t.Cleanup(n.Close)
	n.Notify("tel-flaky", "message", "")
	n.Notify("tel-gone", "message", "")
	flaky.waitFor(t, 3)
	testsvc.WaitFor(t, 10*time.Second, "sent 1, failed 1", func() bool { return m.sent.Load() == 1 && m.failed.Load() == 1 })
	if got := len(gone.requests()); got != 1 {
		t.Fatalf("an endpoint answering 404 got %d attempts, want 1", got)
	}
	n.Notify("tel-gone", "message", "")
	gone.waitFor(t, 2)
}

// TestPushQueueBounded: with a notification in progress (Queue of them
// may be) and the queue full, a notification is dropped and counted, and
// Notify does not block.
func TestPushQueueBounded(t *testing.T) {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { s.Close() })
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	for _, d := range []string{"a", "b", "c"} {
		register(t, s, d, push.Target{Kind: push.KindWebhook, URL: slow.URL})
	}
	var m counts
	n := push.New(push.Config{Store: s, Queue: 1, Workers: 1, Metrics: &m, Policy: loopback})
	t.Cleanup(n.Close)
	n.Notify("a", "message", "") // taken by the worker, which waits on slow
	<-arrived
	n.Notify("b", "message", "") // fills the queue
	n.Notify("c", "message", "") // dropped
	if m.dropped.Load() != 1 {
		t.Fatalf("dropped %d, want 1", m.dropped.Load())
	}
}

// ntfyStandIn copies ntfy's publish API as of ntfy v2.11.0
// (server/server.go handlePublish): POST or PUT /<topic>, the topic
// matching ^[-_A-Za-z0-9]{1,64}$, the body the message (at most 4096
// bytes), the title, priority and tags from X-Title (Title, t), X-Priority
// (Priority, p: 1-5 or min, low, default, high, max) and X-Tags (Tags,
// ta), an access token as Authorization: Bearer; it answers 200 with the
// message as JSON {id, time, expires, event:"message", topic, message,
// title, tags, priority}, and 400 {"code":40010,"http":400,"error":…} to a
// bad priority. No ntfy module is served by the module proxy here
// (heckel.io/ntfy/v2 and github.com/binwiederhier/ntfy are refused), so
// the test runs against this stand-in rather than a real ntfy server.
func ntfyStandIn(t *testing.T, token string) (*httptest.Server, chan map[string]any) {
	topicRe := regexp.MustCompile(`^/[-_A-Za-z0-9]{1,64}$`)
	priorities := map[string]int{"1": 1, "min": 1, "2": 2, "low": 2, "3": 3, "default": 3, "": 3, "4": 4, "high": 4, "5": 5, "max": 5, "urgent": 5}
	header := func(r *http.Request, names ...string) string {
		for _, n := range names {
			if v := r.Header.Get(n); v != "" {
				return v
			}
		}
		return ""
	}
	msgs := make(chan map[string]any, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if (r.Method != http.MethodPost && r.Method != http.MethodPut) || !topicRe.MatchString(r.URL.Path) {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"code":40401,"http":404,"error":"page not found"}`)
			return
		}
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"code":40301,"http":403,"error":"forbidden"}`)
			return
		}
		prio, ok := priorities[strings.ToLower(header(r, "X-Priority", "Priority", "prio", "p"))]
		if !ok {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"code":40010,"http":400,"error":"invalid request: priority invalid"}`)
			return
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 4097))
		if len(body) > 4096 {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			return
		}
		var tags []string
		if v := header(r, "X-Tags", "Tags", "Tag", "ta"); v != "" {
			tags = strings.Split(v, ",")
		}
		now := time.Now().Unix()
		m := map[string]any{"id": "abcdefghijkl", "time": now, "expires": now + 43200, "event": "message",
			"topic": strings.TrimPrefix(r.URL.Path, "/"), "message": string(body),
			"title": header(r, "X-Title", "Title", "ti", "t"), "tags": tags, "priority": prio}
		msgs <- m
		json.NewEncoder(w).Encode(m)
	}))
	t.Cleanup(srv.Close)
	return srv, msgs
}

// TestPushNtfy: an ntfy target gets a message published on its topic, with
// its access token, saying only that something waits.
func TestPushNtfy(t *testing.T) {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { s.Close() })
	srv, msgs := ntfyStandIn(t, "tk_secret")
	register(t, s, "tel-1", push.Target{Kind: push.KindNtfy, URL: srv.URL + "/hermes_tel-1", Token: "tk_secret"})
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback})
	t.Cleanup(n.Close)
	n.Notify("tel-1", "message", "the secret answer")
	select {
	case got := <-msgs:
		if got["topic"] != "hermes_tel-1" || got["title"] != "Hermes" || strings.Contains(got["message"].(string), "secret") || got["message"] == "" {
			t.Fatalf("ntfy message %v, want a contentless one on hermes_tel-1 titled Hermes", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ntfy message within 10 s")
	}
	testsvc.WaitFor(t, 10*time.Second, "sent counted", func() bool { return m.sent.Load() == 1 })
}

// TestTargetValidate: the bounds and forms of a target, at the boundary.
func TestTargetValidate(t *testing.T) {
	base := "https://push.example/"
	exact := base + strings.Repeat("a", push.MaxURLBytes-len(base))
	for _, tc := range []struct {
		name string
		t    push.Target
		ok   bool
	}{
		{"webhook", push.Target{Kind: "webhook", URL: "https://hooks.example/h?x=1"}, true},
		{"url of exactly 2048 bytes", push.Target{Kind: "unifiedpush", URL: exact}, true},
		{"url of 2049 bytes", push.Target{Kind: "unifiedpush", URL: exact + "a"}, false},
		{"no kind", push.Target{URL: "https://a.example/"}, false},
		{"unknown kind", push.Target{Kind: "gcm", URL: "https://a.example/"}, false},
		{"no url", push.Target{Kind: "webhook"}, false},
		{"relative url", push.Target{Kind: "webhook", URL: "/hook"}, false},
		{"ftp url", push.Target{Kind: "webhook", URL: "ftp://a.example/"}, false},
		{"credentials in url", push.Target{Kind: "webhook", URL: "https://u:p@a.example/"}, false},
		{"ntfy topic", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/my_topic-1", Token: "tk_x"}, true},
		{"ntfy topic of 65 characters", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/" + strings.Repeat("a", 65)}, false},
		{"ntfy without topic", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/"}, false},
		{"token on a webhook", push.Target{Kind: "webhook", URL: "https://a.example/", Token: "x"}, false},
		{"token of 256 bytes", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: strings.Repeat("k", 256)}, true},
		{"token of 257 bytes", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: strings.Repeat("k", 257)}, false},
		{"token of every printable byte", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "!~tk_AZaz09-._+/="}, true},
		{"token with CR LF", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "tk_a\r\nX-Evil: 1"}, false},
		{"token with LF", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "tk_a\nb"}, false},
		{"token with a tab", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "tk_a\tb"}, false},
		{"token with NUL", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "tk_a\x00"}, false},
		{"token with DEL", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "tk_a\x7f"}, false},
		{"token with a space", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "tk a"}, false},
		{"token past ASCII", push.Target{Kind: "ntfy", URL: "https://ntfy.sh/t", Token: "tk_ä"}, false},
		{"url without a host", push.Target{Kind: "webhook", URL: "http://:8080/hook"}, false},
		{"fcm token", push.Target{Kind: "fcm", Token: "dGVzdA:APA91bH-_x.y"}, true},
		{"fcm token of 4096 bytes", push.Target{Kind: "fcm", Token: strings.Repeat("k", push.MaxDeviceTokenBytes)}, true},
		{"fcm token of 4097 bytes", push.Target{Kind: "fcm", Token: strings.Repeat("k", push.MaxDeviceTokenBytes+1)}, false},
		{"fcm without a token", push.Target{Kind: "fcm"}, false},
		{"fcm with a url", push.Target{Kind: "fcm", URL: "https://a.example/", Token: "t"}, false},
		{"fcm token with LF", push.Target{Kind: "fcm", Token: "a\nb"}, false},
		{"fcm token with a space", push.Target{Kind: "fcm", Token: "a b"}, false},
		{"apns token", push.Target{Kind: "apns", Token: strings.Repeat("0aF9", 16)}, true},
		{"apns token of an odd length", push.Target{Kind: "apns", Token: "abc"}, false},
		{"apns token not hex", push.Target{Kind: "apns", Token: "zz"}, false},
		{"apns token with a slash", push.Target{Kind: "apns", Token: "ab/../cd"}, false},
		{"apns without a token", push.Target{Kind: "apns"}, false},
		{"apns with a url", push.Target{Kind: "apns", URL: "https://a.example/", Token: "ab"}, false},
	} {
		if err := tc.t.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestPushNamesTheDeviceByItsOwnID: a device of an owner of the tenants
// file is its device key inside the cluster; the notification, which
// leaves it, names the phone's own id.
func TestPushNamesTheDeviceByItsOwnID(t *testing.T) {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { s.Close() })
	hook := newEndpoint(t)
	register(t, s, tenant.DeviceKey("acme", "tel-1"), push.Target{Kind: push.KindWebhook, URL: hook.URL + "/hook"})
	n := push.New(push.Config{Store: s, Key: []byte("k"), Workers: 1, Policy: loopback, Log: testsvc.Logger(t)})
	t.Cleanup(n.Close)
	n.Notify(tenant.DeviceKey("acme", "tel-1"), "message", "x")
	var nt push.Notice
	if err := json.Unmarshal(hook.waitFor(t, 1)[0].body, &nt); err != nil || nt.Device != "tel-1" {
		t.Fatalf("notice %+v (%v), want device tel-1", nt, err)
	}
}
