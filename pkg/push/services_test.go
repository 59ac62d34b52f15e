package push_test

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/push/pushtest"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// The tests of FCM and APNs, against the loopback stand-ins of
// pkg/push/pushtest (which cite what they copy of each service's API).

const (
	fcmToken  = "cXh0ZXN0OkFQQTkxYkgtdGVzdA:APA91bHtest-token_1"
	apnsToken = "8c3a0e5f1b2d4c6e8a0b2c4d6e8f0a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e1f"
	// Another device's tokens, for a sentinel notification: notifications
	// are prepared (their burst claimed) one at a time, in order, so once
	// a sentinel notified after a burst is sent, every notification of the
	// burst before it was taken up or refused.
	sentinelFCMToken  = "cXh0ZXN0OkFQQTkxYkgtdGVzdA:APA91bHtest-token_2"
	sentinelAPNsToken = "9d4b1f6a2c3e5d7f9b1c3e5f7a9b0c2d4e6f8a0b1c3d5e7f9a0b2c4d6e8f0a2b"
)

// loadFCM is the fcm stand-in's service as LoadFCM makes it.
func loadFCM(t *testing.T, f *pushtest.FCM) *push.FCM {
	t.Helper()
	svc, err := push.LoadFCM(push.FCMConfig{Credentials: f.Credentials(), URL: f.URL})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// loadAPNs is the apns stand-in's service, in the sandbox environment
// with the stand-in's host.
func loadAPNs(t *testing.T, a *pushtest.APNs) *push.APNs {
	t.Helper()
	svc, err := push.LoadAPNs(push.APNsConfig{Key: a.KeyP8(), KeyID: a.KeyID, TeamID: a.TeamID, Topic: a.Topic,
		Environment: push.APNsSandbox, URL: a.URL})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestFCMNotification: a burst for a sleeping Android phone is one FCM v1
// send, with an access token from the service account's token exchange:
// its registration token, a notification that says only that something
// waits, the collapse key and tag that make a burst one notification,
// priority HIGH and a ttl of what the outbox keeps (24 h).
func TestFCMNotification(t *testing.T) {
	s := newStore(t)
	f := pushtest.NewFCM(t)
	register(t, s, "tel-android", push.Target{Kind: push.KindFCM, Token: fcmToken})
	register(t, s, "tel-sentinel", push.Target{Kind: push.KindFCM, Token: sentinelFCMToken})
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, FCM: loadFCM(t, f), TTL: 24 * time.Hour})
	t.Cleanup(n.Close)
	if !slices.Equal(n.AppKinds(), []string{"fcm"}) || !n.Offers("fcm") || n.Offers("apns") {
		t.Fatalf("AppKinds %v, want [fcm]", n.AppKinds())
	}
	before := time.Now()
	n.Notify("tel-android", "message", "the secret answer")
	n.Notify("tel-android", "prompt", "and a card")
	n.Notify("tel-sentinel", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "sent", func() bool { return m.sent.Load() == 2 })
	var sends []pushtest.FCMSend
	for _, sd := range f.Sends() {
		if sd.Request.Message.Token == fcmToken {
			sends = append(sends, sd)
		}
	}
	if len(sends) != 1 || sends[0].Status != http.StatusOK || f.Exchanges() != 1 {
		t.Fatalf("%d sends (%+v), %d token exchanges; want one send, answered 200, after one exchange", len(sends), sends, f.Exchanges())
	}
	msg := sends[0].Request.Message
	a := msg.Android
	if msg.Token != fcmToken || msg.Notification == nil || msg.Notification.Title != "Hermes" ||
		msg.Notification.Body != "Hermes has something for you" || a == nil || a.CollapseKey != "hermes" ||
		a.Priority != "HIGH" || a.TTL != "86400s" || a.Notification["tag"] != "hermes" ||
		msg.Data["device"] != "tel-android" || msg.Data["what"] != "message" {
		t.Fatalf("message %s", sends[0].Body)
	}
	if strings.Contains(string(sends[0].Body), "secret") || strings.Contains(string(sends[0].Body), "card") {
		t.Fatalf("the notification carries the message's text: %s", sends[0].Body)
	}
	exp, _ := strconv.ParseInt(msg.Apns.Headers["apns-expiration"], 10, 64)
	if msg.Apns.Headers["apns-collapse-id"] != "hermes" || msg.Apns.Headers["apns-priority"] != "10" ||
		exp < before.Add(24*time.Hour).Unix()-1 || exp > time.Now().Add(24*time.Hour).Unix() {
		t.Fatalf("the apns block of an FCM message %v, want collapse id hermes, priority 10, expiry in 24 h", msg.Apns.Headers)
	}
}

// TestFCMContent: with Content, the notification shows the message's
// text, cut to 1 KiB.
func TestFCMContent(t *testing.T) {
	s := newStore(t)
	f := pushtest.NewFCM(t)
	register(t, s, "tel-1", push.Target{Kind: push.KindFCM, Token: fcmToken})
	register(t, s, "tel-2", push.Target{Kind: push.KindFCM, Token: fcmToken + "2"})
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, FCM: loadFCM(t, f), Content: true})
	t.Cleanup(n.Close)
	n.Notify("tel-1", "message", "the answer is 42")
	n.Notify("tel-2", "message", strings.Repeat("é", 2000))
	testsvc.WaitFor(t, 10*time.Second, "sent", func() bool { return m.sent.Load() == 2 })
	for _, s := range f.Delivered() {
		body := s.Request.Message.Notification.Body
		switch s.Request.Message.Token {
		case fcmToken:
			if body != "the answer is 42" {
				t.Errorf("body %q, want the message's text", body)
			}
		default:
			if len(body) > 1024 || !strings.HasSuffix(body, "…") || !strings.HasPrefix(body, "éé") {
				t.Errorf("a long text's body is %d bytes (%.20q…), want at most 1024 ending in …", len(body), body)
			}
		}
	}
}

// TestFCMUnregisteredForgotten: a token FCM answers 404 UNREGISTERED is
// forgotten, counted and logged (without the token); a registration made
// again meanwhile is not.
func TestFCMUnregisteredForgotten(t *testing.T) {
	s := newStore(t)
	f := pushtest.NewFCM(t)
	f.Unregister(fcmToken)
	register(t, s, "tel-gone", push.Target{Kind: push.KindFCM, Token: fcmToken})
	var buf syncBuffer
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, FCM: loadFCM(t, f),
		Log: slog.New(slog.NewTextHandler(&buf, nil))})
	t.Cleanup(n.Close)
	n.Notify("tel-gone", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "forgotten", func() bool { return m.forgot("fcm") == 1 })
	if _, err := s.PushTarget(t.Context(), "tel-gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the dead token's registration: %v, want it forgotten", err)
	}
	if len(f.Sends()) != 1 || m.failed.Load() != 0 || m.sent.Load() != 0 {
		t.Fatalf("%d sends, %d failed, %d sent; want one send, not retried, neither failed nor sent", len(f.Sends()), m.failed.Load(), m.sent.Load())
	}
	logged := buf.String()
	if !strings.Contains(logged, "registration forgotten") || !strings.Contains(logged, "UNREGISTERED") || strings.Contains(logged, fcmToken) {
		t.Fatalf("the log line of a forgotten token, naming why and not the token:\n%s", logged)
	}
}

// TestFCMRetryAfter: a 429 with Retry-After is retried after what it asks
// (not the backoff's wait), and then sent.
func TestFCMRetryAfter(t *testing.T) {
	s := newStore(t)
	f := pushtest.NewFCM(t)
	f.Throttle(1, "7")
	register(t, s, "tel-1", push.Target{Kind: push.KindFCM, Token: fcmToken})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, FCM: loadFCM(t, f), Sleep: waits.sleep})
	t.Cleanup(n.Close)
	n.Notify("tel-1", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "sent", func() bool { return m.sent.Load() == 1 })
	sends := f.Sends()
	if len(sends) != 2 || sends[0].Status != http.StatusTooManyRequests || sends[1].Status != http.StatusOK ||
		!slices.Equal(waits.all(), []time.Duration{7 * time.Second}) || f.Exchanges() != 1 {
		t.Fatalf("sends %d, waits %v, %d exchanges; want a 429, a wait of its 7 s, a 200, one exchange", len(sends), waits.all(), f.Exchanges())
	}
}

// TestFCMRenewsRefusedAccessToken: an access token FCM answers 401 is
// fetched anew for the retry.
func TestFCMRenewsRefusedAccessToken(t *testing.T) {
	s := newStore(t)
	f := pushtest.NewFCM(t)
	register(t, s, "tel-1", push.Target{Kind: push.KindFCM, Token: fcmToken})
	register(t, s, "tel-2", push.Target{Kind: push.KindFCM, Token: fcmToken + "2"})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, FCM: loadFCM(t, f), Sleep: waits.sleep})
	t.Cleanup(n.Close)
	n.Notify("tel-1", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "sent", func() bool { return m.sent.Load() == 1 })
	f.RevokeTokens()
	n.Notify("tel-2", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "sent again", func() bool { return m.sent.Load() == 2 })
	sends := f.Sends()
	if len(sends) != 3 || sends[1].Status != http.StatusUnauthorized || f.Exchanges() != 2 {
		t.Fatalf("%d sends, %d exchanges; want 200, 401, 200 and a second exchange", len(sends), f.Exchanges())
	}
}

// TestFCMTokenExchangeRefused: a service account the token endpoint
// refuses (its key is not the account's) fails the notification at once:
// a retry would be refused the same way.
func TestFCMTokenExchangeRefused(t *testing.T) {
	s := newStore(t)
	f, other := pushtest.NewFCM(t), pushtest.NewFCM(t)
	key := f.Key
	f.Key = other.Key // the file's key is not the one the endpoint knows
	fcm := loadFCM(t, f)
	f.Key = key
	register(t, s, "tel-1", push.Target{Kind: push.KindFCM, Token: fcmToken})
	var buf syncBuffer
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, FCM: fcm,
		Log: slog.New(slog.NewTextHandler(&buf, nil))})
	t.Cleanup(n.Close)
	n.Notify("tel-1", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "failed", func() bool { return m.failed.Load() == 1 })
	if len(f.Sends()) != 0 || !strings.Contains(buf.String(), "invalid_grant") {
		t.Fatalf("%d sends; log:\n%s\nwant none, and the endpoint's invalid_grant logged", len(f.Sends()), buf.String())
	}
}

// TestAPNsNotification: a burst for a sleeping iPhone is one HTTP/2
// request to /3/device/<token> with a provider token APNs verifies (ES256,
// the key id and team), the bundle id as topic, push type alert, priority
// 10, an expiry of what the outbox keeps, the collapse id, and an alert
// that says only that something waits.
func TestAPNsNotification(t *testing.T) {
	s := newStore(t)
	a := pushtest.NewAPNs(t)
	register(t, s, "tel-ios", push.Target{Kind: push.KindAPNs, Token: apnsToken})
	register(t, s, "tel-sentinel", push.Target{Kind: push.KindAPNs, Token: sentinelAPNsToken})
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, APNs: loadAPNs(t, a), RootCAs: a.CertPool(), TTL: 6 * time.Hour})
	t.Cleanup(n.Close)
	before := time.Now()
	n.Notify("tel-ios", "message", "the secret answer")
	n.Notify("tel-ios", "message", "more")
	n.Notify("tel-sentinel", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "sent", func() bool { return m.sent.Load() == 2 })
	var reqs []pushtest.APNsRequest
	for _, r := range a.Requests() {
		if r.Token == apnsToken {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) != 1 || reqs[0].Status != http.StatusOK {
		t.Fatalf("%d requests (%+v), want one answered 200", len(reqs), reqs)
	}
	r := reqs[0]
	exp, _ := strconv.ParseInt(r.Header.Get("apns-expiration"), 10, 64)
	if r.Proto != "HTTP/2.0" || r.Token != apnsToken || r.Header.Get("apns-topic") != a.Topic ||
		r.Header.Get("apns-push-type") != "alert" || r.Header.Get("apns-priority") != "10" ||
		r.Header.Get("apns-collapse-id") != "hermes" ||
		exp < before.Add(6*time.Hour).Unix()-1 || exp > time.Now().Add(6*time.Hour).Unix() {
		t.Fatalf("request %s %s %v", r.Proto, r.Token, r.Header)
	}
	aps, _ := r.Payload["aps"].(map[string]any)
	alert, _ := aps["alert"].(map[string]any)
	if alert["title"] != "Hermes" || alert["body"] != "Hermes has something for you" || aps["thread-id"] != "hermes" ||
		r.Payload["device"] != "tel-ios" || strings.Contains(string(r.Body), "secret") {
		t.Fatalf("payload %s, want a contentless alert", r.Body)
	}
}

// TestAPNsDeadTokens: 410 Unregistered and 400 BadDeviceToken forget the
// registration; a 400 of another reason (the topic) does not.
func TestAPNsDeadTokens(t *testing.T) {
	s := newStore(t)
	a := pushtest.NewAPNs(t)
	gone, bad := apnsToken, strings.Repeat("ab", 32)
	a.Unregister(gone)
	a.BadToken(bad)
	register(t, s, "tel-gone", push.Target{Kind: push.KindAPNs, Token: gone})
	register(t, s, "tel-bad", push.Target{Kind: push.KindAPNs, Token: bad})
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, APNs: loadAPNs(t, a), RootCAs: a.CertPool()})
	t.Cleanup(n.Close)
	n.Notify("tel-gone", "message", "")
	n.Notify("tel-bad", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "forgotten", func() bool { return m.forgot("apns") == 2 })
	for _, dev := range []string{"tel-gone", "tel-bad"} {
		if _, err := s.PushTarget(t.Context(), dev); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: %v, want forgotten", dev, err)
		}
	}

	// A topic APNs refuses is the server's mistake, not the token's.
	wrong, err := push.LoadAPNs(push.APNsConfig{Key: a.KeyP8(), KeyID: a.KeyID, TeamID: a.TeamID, Topic: "org.other.app", URL: a.URL})
	if err != nil {
		t.Fatal(err)
	}
	register(t, s, "tel-kept", push.Target{Kind: push.KindAPNs, Token: strings.Repeat("cd", 32)})
	var m2 counts
	n2 := push.New(push.Config{Store: s, Metrics: &m2, Policy: loopback, APNs: wrong, RootCAs: a.CertPool()})
	t.Cleanup(n2.Close)
	n2.Notify("tel-kept", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "failed", func() bool { return m2.failed.Load() == 1 })
	if _, err := s.PushTarget(t.Context(), "tel-kept"); err != nil || m2.forgot("apns") != 0 {
		t.Fatalf("after BadTopic: %v, %d forgotten; want the registration kept", err, m2.forgot("apns"))
	}
}

// TestAPNsRetries: a 429 with Retry-After is retried after it, and a
// provider token APNs calls expired is signed again for the retry.
func TestAPNsRetries(t *testing.T) {
	s := newStore(t)
	a := pushtest.NewAPNs(t)
	a.Throttle(1, "3")
	a.ExpireProviderTokens(1)
	register(t, s, "tel-ios", push.Target{Kind: push.KindAPNs, Token: apnsToken})
	var m counts
	var waits sleeps
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, APNs: loadAPNs(t, a), RootCAs: a.CertPool(), Sleep: waits.sleep,
		Backoff: time.Millisecond})
	t.Cleanup(n.Close)
	n.Notify("tel-ios", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "sent", func() bool { return m.sent.Load() == 1 })
	var got []string
	for _, r := range a.Requests() {
		got = append(got, strconv.Itoa(r.Status)+" "+r.Reason)
	}
	w := waits.all()
	if !slices.Equal(got, []string{"403 ExpiredProviderToken", "429 TooManyRequests", "200 "}) || len(w) != 2 || w[1] != 3*time.Second {
		t.Fatalf("answers %q, waits %v; want an expired provider token retried, a 429 waited its 3 s, then 200", got, w)
	}
}

// TestServicesPolicy: FCM and APNs go through the address policy like any
// endpoint: at loopback, not allowed, nothing reaches them.
func TestServicesPolicy(t *testing.T) {
	s := newStore(t)
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	register(t, s, "tel-android", push.Target{Kind: push.KindFCM, Token: fcmToken})
	register(t, s, "tel-ios", push.Target{Kind: push.KindAPNs, Token: apnsToken})
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, FCM: loadFCM(t, f), APNs: loadAPNs(t, a), RootCAs: a.CertPool(), Attempts: 2,
		Sleep: (&sleeps{}).sleep})
	t.Cleanup(n.Close)
	n.Notify("tel-android", "message", "")
	n.Notify("tel-ios", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "both failed", func() bool { return m.failed.Load() == 2 })
	if f.Exchanges() != 0 || len(f.Sends()) != 0 || len(a.Requests()) != 0 {
		t.Fatalf("%d exchanges, %d FCM sends, %d APNs requests reached loopback; want none", f.Exchanges(), len(f.Sends()), len(a.Requests()))
	}
}

// TestServiceOutageHoldsNoOneElse: while FCM hangs, APNs and a webhook
// are notified at once, and FCM's notifications past a quarter of the
// queue are dropped rather than holding the queue.
func TestServiceOutageHoldsNoOneElse(t *testing.T) {
	s := newStore(t)
	hang := newSlowEndpoint(t)
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	fcm, err := push.LoadFCM(push.FCMConfig{Credentials: f.Credentials(), URL: hang.URL}) // sends hang; tokens come
	if err != nil {
		t.Fatal(err)
	}
	hook := newEndpoint(t)
	const androids = 12
	for i := range androids {
		register(t, s, "tel-android-"+strconv.Itoa(i), push.Target{Kind: push.KindFCM, Token: fcmToken + strconv.Itoa(i)})
	}
	register(t, s, "tel-ios", push.Target{Kind: push.KindAPNs, Token: apnsToken})
	register(t, s, "tel-hook", push.Target{Kind: push.KindWebhook, URL: hook.URL})
	var m counts
	n := push.New(push.Config{Store: s, Metrics: &m, Policy: loopback, FCM: fcm, APNs: loadAPNs(t, a), RootCAs: a.CertPool(),
		Queue: 16, Timeout: time.Minute})
	t.Cleanup(n.Close)
	for i := range androids {
		n.Notify("tel-android-"+strconv.Itoa(i), "message", "")
	}
	testsvc.WaitFor(t, 10*time.Second, "FCM's bound of requests in flight", func() bool {
		inFlight, _, _ := hang.counts()
		return inFlight == 4
	})
	start := time.Now()
	n.Notify("tel-ios", "message", "")
	n.Notify("tel-hook", "message", "")
	testsvc.WaitFor(t, 10*time.Second, "APNs and the webhook notified", func() bool { return m.sent.Load() == 2 })
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("APNs and the webhook took %v behind a hanging FCM", d)
	}
	// A quarter of the queue (4) in progress for FCM: the rest dropped.
	if inFlight, most, _ := hang.counts(); most != 4 || m.dropped.Load() != androids-4 {
		t.Fatalf("FCM: %d in flight, at most %d; %d dropped; want 4 in flight and %d dropped", inFlight, most, m.dropped.Load(), androids-4)
	}
}

// TestNotifierRegistration: Check refuses a service that is not
// configured; Register stores a target as the router API does; Unregister
// forgets only a registration of its kind.
func TestNotifierRegistration(t *testing.T) {
	s := newStore(t)
	f := pushtest.NewFCM(t)
	n := push.New(push.Config{Store: s, Policy: loopback, FCM: loadFCM(t, f)})
	t.Cleanup(n.Close)
	if err := n.Check(push.Target{Kind: push.KindAPNs, Token: apnsToken}); err == nil || !strings.Contains(err.Error(), "MOBILE_PUSH_APNS_KEY_FILE") {
		t.Fatalf("Check of apns without APNs: %v, want a refusal naming the setting", err)
	}
	fcm := push.Target{Kind: push.KindFCM, Token: fcmToken}
	if err := n.Check(fcm); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := n.Register(ctx, "tel-1", fcm); err != nil {
		t.Fatal(err)
	}
	if removed, err := n.Unregister(ctx, "tel-1", push.KindAPNs); removed || err != nil {
		t.Fatalf("Unregister of apns when fcm is registered: %v %v, want nothing removed", removed, err)
	}
	if _, err := s.PushTarget(ctx, "tel-1"); err != nil {
		t.Fatal(err)
	}
	if removed, err := n.Unregister(ctx, "tel-1", push.KindFCM); !removed || err != nil {
		t.Fatalf("Unregister of fcm: %v %v", removed, err)
	}
	if _, err := s.PushTarget(ctx, "tel-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after Unregister: %v", err)
	}
	if removed, err := n.Unregister(ctx, "tel-1", push.KindFCM); removed || err != nil {
		t.Fatalf("Unregister of none: %v %v", removed, err)
	}
}

// TestLoadServices: the configurations that cannot work are refused
// without quoting the key.
func TestLoadServices(t *testing.T) {
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	good := string(f.Credentials())
	noProject := strings.Replace(good, `"project_id": "`+f.Project+`"`, `"project_id": ""`, 1)
	for name, c := range map[string]push.FCMConfig{
		"not json":             {Credentials: []byte("-----BEGIN PRIVATE KEY-----\nMIIE")},
		"user credentials":     {Credentials: []byte(`{"type": "authorized_user", "client_id": "x", "refresh_token": "SECRET"}`)},
		"no project":           {Credentials: []byte(noProject)},
		"a key that is no key": {Credentials: []byte(strings.Replace(good, "MII", "SECRETMII", 1))},
		"ftp url":              {Credentials: []byte(good), URL: "ftp://fcm.example"},
	} {
		_, err := push.LoadFCM(c)
		if err == nil || strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "MII") {
			t.Errorf("LoadFCM, %s: %v, want an error quoting nothing of the file", name, err)
		}
	}
	if fcm, err := push.LoadFCM(push.FCMConfig{Credentials: []byte(noProject), Project: "explicit-1"}); err != nil || fcm.Project() != "explicit-1" {
		t.Errorf("LoadFCM with an explicit project: %v", err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(f.Key)
	rsaP8 := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	base := push.APNsConfig{Key: a.KeyP8(), KeyID: a.KeyID, TeamID: a.TeamID, Topic: a.Topic}
	for name, mod := range map[string]func(*push.APNsConfig){
		"no key":          func(c *push.APNsConfig) { c.Key = nil },
		"an RSA key":      func(c *push.APNsConfig) { c.Key = rsaP8 },
		"no key id":       func(c *push.APNsConfig) { c.KeyID = "" },
		"no team":         func(c *push.APNsConfig) { c.TeamID = "" },
		"no topic":        func(c *push.APNsConfig) { c.Topic = "" },
		"a topic with LF": func(c *push.APNsConfig) { c.Topic = "org.x\nX: y" },
		"environment":     func(c *push.APNsConfig) { c.Environment = "staging" },
		"http url":        func(c *push.APNsConfig) { c.URL = "http://127.0.0.1:1" },
	} {
		c := base
		mod(&c)
		_, err := push.LoadAPNs(c)
		if err == nil || strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("LoadAPNs, %s: %v, want an error quoting nothing of the key", name, err)
		}
	}
	for env, host := range map[string]string{"": "https://api.push.apple.com", "production": "https://api.push.apple.com", "sandbox": "https://api.sandbox.push.apple.com"} {
		c := base
		c.Environment = env
		if svc, err := push.LoadAPNs(c); err != nil || svc.Host() != host {
			t.Errorf("LoadAPNs, environment %q: %v, want host %s", env, err, host)
		}
	}
}
