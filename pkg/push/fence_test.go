package push_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
)

// The tests of what the security review of push found: where requests go
// (TestPushRefusedWhenDialed, TestPushRedirectNotFollowed), endpoints
// that hang (TestPushSlowEndpointsDoNotHoldOthers, TestPushPerHostBound),
// secrets in logs (TestPushLogsNoSecrets) and retries (TestPushRetryAfter,
// TestPushRetryAfterBound, TestPushRetryClassification,
// TestPushBackoffJitter). All run real loopback HTTP endpoints.

// newStore is a memstore closed with the test.
func newStore(t *testing.T) store.Store {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { s.Close() })
	return s
}

// store registers target as it is stored, bypassing registration's check:
// a target registered before it, or a name whose DNS changed since.
func storeTarget(t *testing.T, s store.Store, device string, target push.Target) {
	t.Helper()
	data, _ := json.Marshal(target)
	if err := s.SetPushTarget(t.Context(), device, data, push.TargetTTL); err != nil {
		t.Fatal(err)
	}
}

// slowEndpoint answers nothing until the test ends (or the request is
// cancelled), counting the requests in flight and the most at once.
type slowEndpoint struct {
	*httptest.Server
	mu             sync.Mutex
	inFlight, most int
	total          int
}

func newSlowEndpoint(t *testing.T) *slowEndpoint {
	e := &slowEndpoint{}
	stop := make(chan struct{})
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.inFlight++
		e.total++
		e.most = max(e.most, e.inFlight)
		e.mu.Unlock()
		defer func() {
			e.mu.Lock()
			e.inFlight--
			e.mu.Unlock()
		}()
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(e.Close)                // after the handlers return:
	t.Cleanup(func() { close(stop) }) // cleanups run last first
	return e
}

func (e *slowEndpoint) counts() (inFlight, most, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inFlight, e.most, e.total
}

// arrivals is an endpoint that reports each request's arrival.
func arrivals(t *testing.T) (*httptest.Server, chan struct{}) {
	got := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got <- struct{}{} }))
	t.Cleanup(srv.Close)
	return srv, got
}

// within fails the test unless ch yields within d, a deadline, not a sleep.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	start := time.Now()
	select {
	case <-ch:
		t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

// TestPushRefusedWhenDialed: with the default policy, a target that
// leads to loopback is refused when it is dialed, whatever registration
// let through (a literal, an IPv4-mapped IPv6 literal, or a name that
// resolves there, as a name whose DNS changed would): the endpoint gets
// nothing, each fails once, without a retry. A name is checked on what
// it resolves to, so this is the check DNS cannot swap.
func TestPushRefusedWhenDialed(t *testing.T) {
	s := newStore(t)
	hook := newEndpoint(t)
	_, port, _ := net.SplitHostPort(hook.Listener.Addr().String())
	for i, u := range []string{
		"http://127.0.0.1:" + port + "/hook",
		"http://[::ffff:127.0.0.1]:" + port + "/hook",
		"http://localhost:" + port + "/hook",
	} {
		storeTarget(t, s, "tel-"+strconv.Itoa(i), push.Target{Kind: push.KindWebhook, URL: u})
	}
	var m counts
	var waits sleeps
	var buf syncBuffer
	n := push.New(push.Config{Store: s, Metrics: &m, Sleep: waits.sleep, Log: slog.New(slog.NewTextHandler(&buf, nil))})
	t.Cleanup(n.Close)
	for i := range 3 {
		n.Notify("tel-"+strconv.Itoa(i), "message", "")
	}
	testsvc.WaitFor(t, 10*time.Second, "3 notifications failed", func() bool { return m.failed.Load() == 3 })
	if got := len(hook.requests()); got != 0 || m.sent.Load() != 0 {
		t.Fatalf("a loopback endpoint got %d requests (%d sent), want none", got, m.sent.Load())
	}
	if w := waits.all(); len(w) != 0 {
		t.Fatalf("a refused address was retried after %v, want no retry", w)
	}
	if logged := buf.String(); strings.Count(logged, "is a loopback address") != 3 {
		t.Fatalf("the failures are not the 3 refusals of a loopback address:\n%s", logged)
	}
}

// TestPushRedirectNotFollowed: an endpoint answering 307 to another gets
// one request and the other none (a followed 307 would send the body
// there again, past the check of the registered URL); one redirecting to
// itself gets one request, not 10 per attempt for 5 attempts. A 3xx is a
// failure, not retried.
func TestPushRedirectNotFollowed(t *testing.T) {
	s := newStore(t)
	elsewhere, away, loop := newEndpoint(t), newEndpoint(t), newEndpoint(t)
	away.respond = func(_ int, w http.ResponseWriter) {
		w.Header().Set("Location", elsewhere.URL+"/internal")
		w.WriteHeader(http.StatusTemporaryRedirect)
	}
	loop.respond = func(_ int, w http.ResponseWriter) {
		w.Header().Set("Location", loop.URL+"/again")
		w.WriteHeader(http.StatusTemporaryRedirect)
	}
	register(t, s, "tel-away", push.Target{Kind: push.KindWebhook, URL: away.URL + "/hook"})
	register(t, s, "tel-loop", push.Target{Kind: push.KindUnifiedPush, URL: loop.URL + "/up"})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, Sleep: waits.sleep})
	t.Cleanup(n.Close)
	n.Notify("tel-away", "message", "")
	n.Notify("tel-loop", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "2 notifications failed", func() bool { return m.failed.Load() == 2 })
	if a, e, l := len(away.requests()), len(elsewhere.requests()), len(loop.requests()); a != 1 || e != 0 || l != 1 {
		t.Fatalf("requests: redirecting %d, its target %d, redirect loop %d; want 1, 0, 1", a, e, l)
	}
	if w := waits.all(); len(w) != 0 {
		t.Fatalf("a 307 was retried after %v, want no retry", w)
	}
}

// TestPushSlowEndpointsDoNotHoldOthers: four endpoints that never answer
// hold a request each; another device's notification to a healthy
// endpoint is sent within 2 s meanwhile (before, the four held all four
// workers, for 10 s an attempt and 5 attempts).
func TestPushSlowEndpointsDoNotHoldOthers(t *testing.T) {
	s := newStore(t)
	var slow []*slowEndpoint
	for i := range 4 {
		e := newSlowEndpoint(t)
		slow = append(slow, e)
		register(t, s, "tel-slow-"+strconv.Itoa(i), push.Target{Kind: push.KindWebhook, URL: e.URL})
	}
	healthy, got := arrivals(t)
	register(t, s, "tel-healthy", push.Target{Kind: push.KindWebhook, URL: healthy.URL})
	n := push.New(push.Config{Store: s, Policy: loopback})
	t.Cleanup(n.Close)
	for i := range 4 {
		n.Notify("tel-slow-"+strconv.Itoa(i), "message", "")
	}
	testsvc.WaitFor(t, 10*time.Second, "a request hanging at each slow endpoint", func() bool {
		for _, e := range slow {
			if in, _, _ := e.counts(); in != 1 {
				return false
			}
		}
		return true
	})
	n.Notify("tel-healthy", "message", "")
	within(t, got, 2*time.Second, "the healthy endpoint's notification")
}

// TestPushPerHostBound: ten devices on one endpoint that hangs hold
// exactly PerHost (2) requests there, not one more, though 3 may be in
// flight: the third slot stays free for other endpoints, whose
// notifications are sent at once, twice in a row.
func TestPushPerHostBound(t *testing.T) {
	s := newStore(t)
	slow := newSlowEndpoint(t)
	for i := range 10 {
		register(t, s, "tel-slow-"+strconv.Itoa(i), push.Target{Kind: push.KindWebhook, URL: slow.URL + "/d" + strconv.Itoa(i)})
	}
	healthy, got := arrivals(t)
	register(t, s, "tel-a", push.Target{Kind: push.KindWebhook, URL: healthy.URL})
	register(t, s, "tel-b", push.Target{Kind: push.KindWebhook, URL: healthy.URL})
	n := push.New(push.Config{Store: s, Policy: loopback, Workers: 3, PerHost: 2})
	t.Cleanup(n.Close)
	for i := range 10 {
		n.Notify("tel-slow-"+strconv.Itoa(i), "message", "")
	}
	testsvc.WaitFor(t, 10*time.Second, "2 requests hanging at the slow endpoint", func() bool {
		in, _, _ := slow.counts()
		return in >= 2
	})
	n.Notify("tel-a", "message", "")
	within(t, got, 2*time.Second, "another endpoint's first notification")
	n.Notify("tel-b", "message", "")
	within(t, got, 2*time.Second, "another endpoint's second notification")
	if in, most, total := slow.counts(); in != 2 || most != 2 || total != 2 {
		t.Fatalf("the slow endpoint has %d requests in flight, %d at most, %d in all; want 2, 2, 2", in, most, total)
	}
}

// TestPushLogsNoSecrets: the failures of a UnifiedPush endpoint that
// cannot be reached and of one that answers 500, of an ntfy topic that
// refuses its token, and of a webhook that redirects are logged naming
// each endpoint by scheme and host, never its path, query, topic or
// token.
func TestPushLogsNoSecrets(t *testing.T) {
	s := newStore(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	failing := newEndpoint(t)
	failing.status = func(int) int { return http.StatusInternalServerError }
	ntfy, _ := ntfyStandIn(t, "tk_other")
	moved := newEndpoint(t)
	moved.respond = func(_ int, w http.ResponseWriter) {
		w.Header().Set("Location", "/elsewhere")
		w.WriteHeader(http.StatusFound)
	}
	targets := map[string]push.Target{
		"tel-dead":    {Kind: push.KindUnifiedPush, URL: "http://" + dead + "/up/S3CRET-dead?k=S3CRET-q"},
		"tel-failing": {Kind: push.KindUnifiedPush, URL: failing.URL + "/up/S3CRET-failing"},
		"tel-ntfy":    {Kind: push.KindNtfy, URL: ntfy.URL + "/S3CRET_topic", Token: "tk_S3CRET"},
		"tel-moved":   {Kind: push.KindWebhook, URL: moved.URL + "/hook/S3CRET-moved"},
	}
	for dev, target := range targets {
		register(t, s, dev, target)
	}
	var buf syncBuffer
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, Attempts: 2, Sleep: waits.sleep,
		Log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	t.Cleanup(n.Close)
	for dev := range targets {
		n.Notify(dev, "message", "")
	}
	testsvc.WaitFor(t, 10*time.Second, "4 notifications failed", func() bool { return m.failed.Load() == 4 })
	logged := buf.String()
	if strings.Contains(logged, "S3CRET") {
		t.Fatalf("the log holds a secret (a path, query, topic or token):\n%s", logged)
	}
	for _, origin := range []string{"http://" + dead, failing.URL, ntfy.URL, moved.URL} {
		if !strings.Contains(logged, "endpoint="+origin+" ") {
			t.Errorf("the log does not name the endpoint %s:\n%s", origin, logged)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the log's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPushRetryAfter: a 429's Retry-After in seconds and a 503's as an
// HTTP-date are waited, not the backoff's own waits.
func TestPushRetryAfter(t *testing.T) {
	s := newStore(t)
	hook := newEndpoint(t)
	hook.respond = func(n int, w http.ResponseWriter) {
		switch n {
		case 1:
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
		case 2:
			w.Header().Set("Retry-After", time.Now().Add(30*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}
	register(t, s, "tel-1", push.Target{Kind: push.KindWebhook, URL: hook.URL})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, Sleep: waits.sleep})
	t.Cleanup(n.Close)
	n.Notify("tel-1", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "sent", func() bool { return m.sent.Load() == 1 })
	w := waits.all()
	if len(hook.requests()) != 3 || len(w) != 2 || w[0] != 7*time.Second || w[1] < 28*time.Second || w[1] > 30*time.Second {
		t.Fatalf("%d requests, waits %v; want 3 requests, waits of 7s and 29-30s (the Retry-After of a 429 and of a 503)", len(hook.requests()), w)
	}
}

// TestPushRetryAfterBound: a Retry-After of exactly MaxRetryAfter (5 min)
// is waited; one second more and the notification is given up at once.
func TestPushRetryAfterBound(t *testing.T) {
	s := newStore(t)
	at, past := newEndpoint(t), newEndpoint(t)
	bound := strconv.Itoa(int(push.MaxRetryAfter / time.Second))
	at.respond = func(n int, w http.ResponseWriter) {
		if n == 1 {
			w.Header().Set("Retry-After", bound)
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}
	past.respond = func(n int, w http.ResponseWriter) {
		w.Header().Set("Retry-After", strconv.Itoa(int(push.MaxRetryAfter/time.Second)+1))
		w.WriteHeader(http.StatusTooManyRequests)
	}
	register(t, s, "tel-at", push.Target{Kind: push.KindWebhook, URL: at.URL})
	register(t, s, "tel-past", push.Target{Kind: push.KindWebhook, URL: past.URL})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, Sleep: waits.sleep})
	t.Cleanup(n.Close)
	n.Notify("tel-at", "message", "")
	n.Notify("tel-past", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "1 sent, 1 failed", func() bool { return m.sent.Load() == 1 && m.failed.Load() == 1 })
	if w := waits.all(); len(w) != 1 || w[0] != push.MaxRetryAfter {
		t.Fatalf("waits %v, want one of %v", w, push.MaxRetryAfter)
	}
	if a, p := len(at.requests()), len(past.requests()); a != 2 || p != 1 {
		t.Fatalf("requests: Retry-After at the bound %d, past it %d; want 2, 1", a, p)
	}
}

// TestPushRetryClassification: a refusal (400, 401, 403, 404, 410, 422)
// is tried once; 408, a 429 or 503 without Retry-After, 500, 502, 504 and
// an endpoint that cannot be reached are tried Attempts (3) times.
func TestPushRetryClassification(t *testing.T) {
	s := newStore(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	permanent := []int{400, 401, 403, 404, 410, 422}
	transient := []int{408, 429, 500, 502, 503, 504}
	eps := map[int]*endpoint{}
	for _, code := range append(append([]int(nil), permanent...), transient...) {
		e := newEndpoint(t)
		e.status = func(int) int { return code }
		eps[code] = e
		register(t, s, "tel-"+strconv.Itoa(code), push.Target{Kind: push.KindWebhook, URL: e.URL})
	}
	register(t, s, "tel-dead", push.Target{Kind: push.KindWebhook, URL: dead})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, Attempts: 3, Sleep: waits.sleep})
	t.Cleanup(n.Close)
	for code := range eps {
		n.Notify("tel-"+strconv.Itoa(code), "message", "")
	}
	n.Notify("tel-dead", "message", "")
	all := int64(len(eps) + 1)
	testsvc.WaitFor(t, 10*time.Second, "every notification failed", func() bool { return m.failed.Load() == all })
	for _, code := range permanent {
		if got := len(eps[code].requests()); got != 1 {
			t.Errorf("%d: %d attempts, want 1", code, got)
		}
	}
	for _, code := range transient {
		if got := len(eps[code].requests()); got != 3 {
			t.Errorf("%d: %d attempts, want 3", code, got)
		}
	}
	if got, want := len(waits.all()), 2*(len(transient)+1); got != want {
		t.Errorf("%d waits, want %d (2 for each of %d retried)", got, want, len(transient)+1)
	}
}

// TestPushBackoffJitter: an endpoint that keeps failing is retried after
// waits of full jitter, each within [0, c], c doubling from Backoff (1 s)
// to MaxBackoff (3 s here), and not at c itself every time.
func TestPushBackoffJitter(t *testing.T) {
	s := newStore(t)
	down := newEndpoint(t)
	down.status = func(int) int { return http.StatusBadGateway }
	const devices = 4
	for i := range devices {
		register(t, s, "tel-"+strconv.Itoa(i), push.Target{Kind: push.KindWebhook, URL: down.URL})
	}
	var m counts
	// One device at a time, so the waits recorded are one device's in
	// order.
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, Sleep: waits.sleep, MaxBackoff: 3 * time.Second})
	t.Cleanup(n.Close)
	ceilings := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}
	atCeiling := 0
	for i := range devices {
		n.Notify("tel-"+strconv.Itoa(i), "message", "")
		testsvc.WaitFor(t, 10*time.Second, "failed", func() bool { return m.failed.Load() == int64(i+1) })
		w := waits.all()
		if len(w) != 4*(i+1) {
			t.Fatalf("after device %d: waits %v, want 4 a device (5 attempts)", i, w)
		}
		w = w[4*i:]
		for j, d := range w {
			if d < 0 || d > ceilings[j] {
				t.Fatalf("device %d: wait %d is %v, want within [0, %v]", i, j+1, d, ceilings[j])
			}
			if d == ceilings[j] {
				atCeiling++
			}
		}
	}
	if atCeiling == 4*devices {
		t.Fatalf("every wait was its ceiling: no jitter")
	}
}

// TestNotifierCheck: a registration's form and its host together, under
// the notifier's policy.
func TestNotifierCheck(t *testing.T) {
	n := push.New(push.Config{Store: newStore(t), Policy: push.Policy{AllowNets: mustNets(t, "192.168.1.0/24")}})
	t.Cleanup(n.Close)
	for _, tc := range []struct {
		t    push.Target
		want string
	}{
		{push.Target{Kind: "ntfy", URL: "https://ntfy.sh/hermes_1", Token: "tk_abc"}, ""},
		{push.Target{Kind: "ntfy", URL: "http://192.168.1.20/hermes_1"}, ""},
		{push.Target{Kind: "ntfy", URL: "http://192.168.2.20/hermes_1"}, "private address"},
		{push.Target{Kind: "webhook", URL: "http://2130706433/hook"}, "loopback"},
		{push.Target{Kind: "webhook", URL: "http://[::1]:8081/admin"}, "loopback"},
		{push.Target{Kind: "unifiedpush", URL: "http://169.254.169.254/latest/meta-data/"}, "cloud metadata"},
		{push.Target{Kind: "ntfy", URL: "https://ntfy.sh/hermes_1", Token: "tk_a\r\nX-Evil: 1"}, "control character"},
	} {
		err := n.Check(tc.t)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Check(%+v) = %v, want %q", tc.t, err, tc.want)
		}
	}
}
