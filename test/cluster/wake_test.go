//go:build unix

package cluster

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/push/pushtest"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
)

// TestPhonesWokenByFCMAndAPNs: the edges and the router are configured
// for FCM and APNs (the stand-ins of pkg/push/pushtest on loopback: FCM's
// v1 send and its service account's token exchange, APNs's HTTP/2 API
// over TLS with a test certificate the processes trust through
// SSL_CERT_FILE). An Android phone and an iPhone see the kinds in ready,
// register their own tokens over their sockets, and sleep. The agent
// answers each twice, cron queues deliveries with a ttl (POST /v1/deliver
// and a deliver frame); each phone gets exactly one notification for the
// burst, with its service's headers, collapse key, an expiry of the
// outbox's day and no content, FCM's after a 429 whose Retry-After was
// waited. Each phone wakes on the other edge and gets everything in
// order. Then two phones whose tokens the services call dead get a burst
// each: their registrations are forgotten.
func TestPhonesWokenByFCMAndAPNs(t *testing.T) {
	t.Parallel()
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	dir := t.TempDir()
	file := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := newCluster(t, options{env: []string{
		"MOBILE_PUSH_FCM_CREDENTIALS_FILE=" + file("service-account.json", f.Credentials()),
		"MOBILE_PUSH_FCM_URL=" + f.URL,
		"MOBILE_PUSH_APNS_KEY_FILE=" + file("AuthKey.p8", a.KeyP8()),
		"MOBILE_PUSH_APNS_KEY_ID=" + a.KeyID,
		"MOBILE_PUSH_APNS_TEAM_ID=" + a.TeamID,
		"MOBILE_PUSH_APNS_TOPIC=" + a.Topic,
		"MOBILE_PUSH_APNS_ENV=sandbox",
		"MOBILE_PUSH_APNS_URL=" + a.URL,
		"SSL_CERT_FILE=" + file("stand-in.pem", a.CertPEM()),
		// The stand-ins listen on loopback, which push refuses unless
		// allowed.
		"MOBILE_PUSH_ALLOW_NETS=127.0.0.1/32",
	}})
	st, err := redisstore.New(testCtx(t), redisstore.Options{URL: c.redis, Mode: c.redisMode, Prefix: c.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	registration := func(dev string) (push.Target, error) {
		data, err := st.PushTarget(testCtx(t), dev)
		var tg push.Target
		if err == nil {
			err = json.Unmarshal(data, &tg)
		}
		return tg, err
	}

	android, iphone := newDevice("tel-android"), newDevice("tel-iphone")
	androidToken := "ZmNt" + testsvc.RandomHex(8) + ":APA91b" + testsvc.RandomHex(40)
	iphoneToken := testsvc.RandomHex(32)
	// Awake: each registers its token over its socket.
	onA := c.pushPhone(t, "A", android, "fcm", androidToken)
	onB := c.pushPhone(t, "B", iphone, "apns", iphoneToken)
	for dev, want := range map[string]push.Target{android: {Kind: "fcm", Token: androidToken}, iphone: {Kind: "apns", Token: iphoneToken}} {
		if got, err := registration(dev); err != nil || got != want {
			t.Fatalf("%s's registration %+v (%v), want %+v", dev, got, err, want)
		}
	}
	// FCM asks the first notification to wait 2 s: more than the first
	// backoff (at most 1 s) of the retries.
	f.Throttle(1, "2")

	// Asleep.
	onA.CloseNow()
	onB.CloseNow()
	for _, dev := range []string{android, iphone} {
		testsvc.WaitFor(t, 15*time.Second, dev+"'s socket gone from the store", func() bool {
			_, err := c.probe.Owners.DeviceOwner(testCtx(t), dev)
			return err != nil
		})
	}
	want := map[string][]agentMessage{}
	for _, dev := range []string{android, iphone} {
		for i := 1; i <= 2; i++ {
			m := agentMessage{ID: "answer-" + strconv.Itoa(i), Text: "secret answer " + strconv.Itoa(i) + " for " + dev, Final: true}
			c.say(t, dev, m)
			want[dev] = append(want[dev], m)
		}
	}
	cronBody := map[string]any{"target": protocol.Session(android), "id": "cron-1", "text": "secret good morning", "ttl": 3600}
	if code, body := c.post(t, "/v1/deliver", c.deliverToken, cronBody); code != 202 || body["queued"] != true {
		t.Fatalf("cron's deliver with a ttl: %d %v, want 202 queued", code, body)
	}
	want[android] = append(want[android], agentMessage{ID: "cron-1", Text: "secret good morning"})
	cron := c.hello(t, "A", newDevice("cron")) // loopback: may deliver
	if err := cron.Send(map[string]any{"t": "deliver", "target": iphone, "id": "cron-2", "text": "secret 7 o'clock", "ttl": 3600}); err != nil {
		t.Fatal(err)
	}
	if d, err := cron.Expect(within(t, 15*time.Second), protocol.TypeDelivered); err != nil || !d.Bool("queued") {
		t.Fatalf("cron's deliver frame with a ttl: %v %v, want delivered queued", d, err)
	}
	want[iphone] = append(want[iphone], agentMessage{ID: "cron-2", Text: "secret 7 o'clock"})

	testsvc.WaitFor(t, 20*time.Second, "a notification at FCM and at APNs", func() bool {
		return len(f.Delivered()) > 0 && len(a.Delivered()) > 0
	})
	started := time.Now()

	// Awake on the other edges: everything, in order.
	for dev, edge := range map[string]string{android: "B", iphone: "A"} {
		p := c.ackingPhone(t, edge, dev)
		var got []agentMessage
		ctx := within(t, 30*time.Second)
		for len(got) < len(want[dev]) {
			fr, err := p.Next(ctx)
			if err != nil {
				t.Fatalf("%s on %s, after %v: %v", dev, edge, got, err)
			}
			if fr.T() == protocol.TypeMessage && fr.Bool("final") {
				got = append(got, agentMessage{ID: fr.Str("id"), Text: fr.Str("text")})
			}
		}
		for i, m := range want[dev] {
			if got[i].ID != m.ID || got[i].Text != m.Text {
				t.Fatalf("%s got %v, want %v", dev, got, want[dev])
			}
		}
		testsvc.WaitFor(t, 15*time.Second, dev+"'s outbox acknowledged", func() bool { return outboxLen(t, c, dev) == 0 })
	}
	if time.Since(started) < time.Second {
		time.Sleep(time.Second - time.Since(started)) // a second notification would be in by now
	}

	// FCM: a 429, waited its Retry-After, then exactly one notification.
	sends := f.Sends()
	if len(sends) != 2 || sends[0].Status != 429 || sends[1].Status != 200 {
		t.Fatalf("FCM got %d sends (%v), want a 429 and one notification", len(sends), statuses(sends))
	}
	if gap := sends[1].At.Sub(sends[0].At); gap < 2*time.Second || gap > 10*time.Second {
		t.Fatalf("FCM's retry came %v after its 429 with Retry-After: 2, want 2 s or a little more", gap)
	}
	msg := sends[1].Request.Message
	if msg.Token != androidToken || msg.Android == nil || msg.Android.CollapseKey != "hermes" || msg.Android.Priority != "HIGH" ||
		msg.Android.TTL != "86400s" || msg.Notification == nil || msg.Notification.Body != "Hermes has something for you" ||
		msg.Data["device"] != android || strings.Contains(string(sends[1].Body), "secret") {
		t.Fatalf("FCM notification %s", sends[1].Body)
	}
	if !strings.HasPrefix(sends[1].Header.Get("Authorization"), "Bearer ya29.stand-in-") || f.Exchanges() < 1 {
		t.Fatalf("FCM notification without an access token of the exchange: %q", sends[1].Header.Get("Authorization"))
	}
	// APNs: exactly one, over HTTP/2, with its headers.
	reqs := a.Requests()
	if len(reqs) != 1 || reqs[0].Status != 200 {
		t.Fatalf("APNs got %d requests, want one notification: %+v", len(reqs), reqs)
	}
	r := reqs[0]
	exp, _ := strconv.ParseInt(r.Header.Get("apns-expiration"), 10, 64)
	if r.Proto != "HTTP/2.0" || r.Token != iphoneToken || r.Header.Get("apns-topic") != a.Topic || r.Header.Get("apns-push-type") != "alert" ||
		r.Header.Get("apns-priority") != "10" || r.Header.Get("apns-collapse-id") != "hermes" ||
		exp < r.At.Add(24*time.Hour-time.Minute).Unix() || exp > r.At.Add(24*time.Hour).Unix() ||
		!strings.HasPrefix(r.Header.Get("authorization"), "bearer ") || strings.Contains(string(r.Body), "secret") {
		t.Fatalf("APNs notification %s /3/device/%s %v %s", r.Proto, r.Token, r.Header, r.Body)
	}

	// Dead tokens: forgotten.
	goneAndroid, goneIphone := newDevice("tel-gone-android"), newDevice("tel-gone-iphone")
	goneFCM, goneAPNs := "ZmNt"+testsvc.RandomHex(8)+":APA91b"+testsvc.RandomHex(40), testsvc.RandomHex(32)
	f.Unregister(goneFCM)
	a.Unregister(goneAPNs)
	c.pushPhone(t, "A", goneAndroid, "fcm", goneFCM).CloseNow()
	c.pushPhone(t, "B", goneIphone, "apns", goneAPNs).CloseNow()
	for _, dev := range []string{goneAndroid, goneIphone} {
		testsvc.WaitFor(t, 15*time.Second, dev+"'s socket gone from the store", func() bool {
			_, err := c.probe.Owners.DeviceOwner(testCtx(t), dev)
			return err != nil
		})
		c.say(t, dev, agentMessage{ID: "answer-1", Text: "are you there?", Final: true})
	}
	for _, dev := range []string{goneAndroid, goneIphone} {
		testsvc.WaitFor(t, 20*time.Second, dev+"'s dead token forgotten", func() bool {
			_, err := registration(dev)
			return errors.Is(err, store.ErrNotFound)
		})
	}
	if got := statuses(f.Sends()); !slices.Equal(got, []int{429, 200, 404}) {
		t.Fatalf("FCM answered %v, want the dead token's 404 once, not retried", got)
	}
	if n := len(a.Requests()); n != 2 || a.Requests()[1].Status != 410 {
		t.Fatalf("APNs got %d requests, want the dead token's one 410", n)
	}
}

func statuses(sends []pushtest.FCMSend) []int {
	var s []int
	for _, x := range sends {
		s = append(s, x.Status)
	}
	return s
}

// pushPhone connects dev to edge as an app that acks, checks that ready
// offers fcm and apns, and registers token of kind with a push frame.
func (c *cluster) pushPhone(t *testing.T, edge, dev, kind, token string) *client.Conn {
	t.Helper()
	conn, err := client.Dial(testCtx(t), c.edge(edge).url, client.Options{Timeout: 5 * time.Second, WriteTimeout: 10 * time.Second, AutoAck: true})
	if err != nil {
		t.Fatalf("dial edge %s: %v", edge, err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	ready, err := conn.Hello(testCtx(t), c.token, device(dev), user)
	if err != nil {
		t.Fatalf("hello as %s on %s: %v", dev, edge, err)
	}
	if kinds := ready.Map("capabilities").Slice("push"); !slices.Equal(kinds, []any{"fcm", "apns"}) {
		t.Fatalf("ready on %s offers push %v, want [fcm apns]", edge, kinds)
	}
	if err := conn.Send(map[string]string{"t": "push", "kind": kind, "token": token}); err != nil {
		t.Fatal(err)
	}
	ans, err := conn.Expect(within(t, 15*time.Second), protocol.TypePush)
	if err != nil || ans.Str("kind") != kind || !ans.Bool("registered") {
		t.Fatalf("registering %s's %s token on %s: %v %v", dev, kind, edge, ans, err)
	}
	return conn
}
