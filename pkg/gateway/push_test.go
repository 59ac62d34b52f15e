package gateway_test

// An app registers its own push token over its socket: the push frame,
// the gateway's extension of Protocol v1 (docs/protocol-notes.md).

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/push/pushtest"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/store"
)

const (
	androidToken  = "ZmNtLXRlc3Q:APA91bF-test_token.1"
	sentinelToken = "ZmNtLXRlc3Q:APA91bF-test_token.2"
	iosToken      = "5f1c0e3a9b7d2c4e6f8a0b1c3d5e7f9a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e"
)

// pushNode is a node that sends FCM and APNs to the stand-ins, which it
// may reach on loopback; tel-bound connects only with bound-token.
func pushNode(t *testing.T, f *pushtest.FCM, a *pushtest.APNs) *node {
	return startNode(t, func(cfg *gateway.Config) {
		cfg.Outbox.PushAllowNets = "127.0.0.1/32"
		cfg.Outbox.PushServices = dispatch.PushServices{
			FCMCredentials: secret.Secret(f.Credentials()), FCMURL: f.URL,
			APNsKey: secret.Secret(a.KeyP8()), APNsKeyID: a.KeyID, APNsTeamID: a.TeamID, APNsTopic: a.Topic, APNsURL: a.URL,
		}
		cfg.Edge.Auth.ExtraTokens = map[string]secret.Secret{"tel-bound": "bound-token"}
	})
}

// sendPush writes a push frame and returns the answer: the push frame or
// an error frame.
func sendPush(t *testing.T, c *client.Conn, kind, token string) client.Frame {
	t.Helper()
	if err := c.Send(map[string]string{"t": "push", "kind": kind, "token": token}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := c.Next(testCtx(t))
		if err != nil {
			t.Fatalf("waiting for the push frame's answer: %v", err)
		}
		if f.T() == protocol.TypePush || f.T() == protocol.TypeError {
			return f
		}
	}
}

// registered is device's registration, or the zero Target.
func registered(t *testing.T, n *node, device string) push.Target {
	t.Helper()
	data, err := n.Store.PushTarget(testCtx(t), device)
	if errors.Is(err, store.ErrNotFound) {
		return push.Target{}
	}
	var tg push.Target
	if err != nil || json.Unmarshal(data, &tg) != nil {
		t.Fatalf("%s's registration %s: %v", device, data, err)
	}
	return tg
}

// TestPushFrame: ready offers the kinds the server sends; a push frame
// registers the app's token for its own device, as the router API does,
// and is answered registered:true; an empty token takes back a
// registration of its kind only (registered:false); a bad token is a
// bad_frame and a kind the server does not send an unsupported_frame,
// neither storing anything.
func TestPushFrame(t *testing.T) {
	t.Parallel()
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	n := pushNode(t, f, a)
	c, ready := n.connect(t, "tel-push")
	if kinds := ready.Map("capabilities").Slice("push"); !slices.Equal(kinds, []any{"fcm", "apns"}) {
		t.Fatalf("ready's capabilities.push %v, want [fcm apns]", kinds)
	}
	if ans := sendPush(t, c, "fcm", androidToken); ans.T() != "push" || ans.Str("kind") != "fcm" || !ans.Bool("registered") || ans.Has("token") {
		t.Fatalf("answer %s, want {push, fcm, registered:true} without the token", ans)
	}
	if got := registered(t, n, "tel-push"); got != (push.Target{Kind: push.KindFCM, Token: androidToken}) {
		t.Fatalf("registration %+v", got)
	}
	for _, bad := range []struct{ kind, token, code, why string }{
		{"apns", "not-hex", "bad_frame", "hex"},
		{"FCM", "a b", "bad_frame", "printable"},
		{"webhook", "x", "unsupported_frame", "fcm or apns"},
	} {
		ans := sendPush(t, c, bad.kind, bad.token)
		if e := client.AsServerError(ans); e == nil || string(e.Code) != bad.code || e.Fatal || !strings.Contains(e.Message, bad.why) {
			t.Fatalf("push %s %q: %s, want a non-fatal %s saying %q", bad.kind, bad.token, ans, bad.code, bad.why)
		}
	}
	if got := registered(t, n, "tel-push"); got.Token != androidToken {
		t.Fatalf("after refused frames the registration is %+v", got)
	}
	// Taking back apns leaves the fcm registration alone; fcm removes it.
	if ans := sendPush(t, c, "apns", ""); ans.T() != "push" || ans.Bool("registered") || ans.Str("kind") != "apns" {
		t.Fatalf("answer %s, want {push, apns, registered:false}", ans)
	}
	if got := registered(t, n, "tel-push"); got.Kind != push.KindFCM {
		t.Fatalf("taking back apns took %+v", got)
	}
	if ans := sendPush(t, c, "fcm", ""); ans.T() != "push" || ans.Bool("registered") {
		t.Fatalf("answer %s", ans)
	}
	if got := registered(t, n, "tel-push"); got != (push.Target{}) {
		t.Fatalf("after taking fcm back: %+v", got)
	}
	// The same socket may register the other kind: it replaces.
	sendPush(t, c, "fcm", androidToken)
	if ans := sendPush(t, c, "APNS", iosToken); !ans.Bool("registered") || ans.Str("kind") != "apns" {
		t.Fatalf("answer %s", ans)
	}
	if got := registered(t, n, "tel-push"); got != (push.Target{Kind: push.KindAPNs, Token: iosToken}) {
		t.Fatalf("registration %+v, want the apns token", got)
	}

	// A token bound to a device registers for that device: the socket's.
	bound := n.dial(t)
	if _, err := bound.Hello(testCtx(t), "bound-token", protocol.Device{ID: "tel-bound"}, protocol.User{}); err != nil {
		t.Fatal(err)
	}
	if ans := sendPush(t, bound, "fcm", androidToken+"b"); !ans.Bool("registered") {
		t.Fatalf("answer %s", ans)
	}
	if got := registered(t, n, "tel-bound"); got.Token != androidToken+"b" {
		t.Fatalf("the bound device's registration %+v", got)
	}
	if got := registered(t, n, "tel-push"); got.Token != iosToken {
		t.Fatalf("another device's registration changed: %+v", got)
	}
}

// TestPushFrameWithoutServices: a server without FCM or APNs offers no
// push kinds in ready (the member is absent, as for an old server) and
// answers a push frame unsupported_frame.
func TestPushFrameWithoutServices(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c, ready := n.connect(t, "tel-nopush")
	if ready.Map("capabilities").Has("push") {
		t.Fatalf("ready %s offers push without services", ready)
	}
	ans := sendPush(t, c, "fcm", androidToken)
	if e := client.AsServerError(ans); e == nil || e.Code != protocol.CodeUnsupportedFrame || e.Fatal {
		t.Fatalf("answer %s, want a non-fatal unsupported_frame", ans)
	}
	if got := registered(t, n, "tel-nopush"); got != (push.Target{}) {
		t.Fatalf("registration %+v", got)
	}
}

// TestPushFrameWakes: a phone registers its FCM token, sleeps, and a
// delivery kept for it (a deliver frame with a ttl) sends one FCM
// notification to that token, saying only that something waits.
func TestPushFrameWakes(t *testing.T) {
	t.Parallel()
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	n := pushNode(t, f, a)
	// A second phone asleep is the sentinel: notifications are prepared
	// one at a time, in order, so once its notification, asked for after
	// the burst, is sent, the burst's second one was refused.
	for dev, token := range map[string]string{"tel-wake": androidToken, "tel-sentinel": sentinelToken} {
		c, _ := n.connect(t, dev)
		sendPush(t, c, "fcm", token)
		c.CloseNow()
		waitOffline(t, n, dev)
	}
	cron, _ := n.connect(t, "cron") // loopback: may deliver
	for _, d := range []struct{ id, target string }{{"d1", "tel-wake"}, {"d2", "tel-wake"}, {"d3", "tel-sentinel"}} {
		if err := cron.Send(map[string]any{"t": "deliver", "id": d.id, "target": d.target, "text": "secret news", "ttl": 3600}); err != nil {
			t.Fatal(err)
		}
		if r, err := cron.Expect(testCtx(t), protocol.TypeDelivered); err != nil || !r.Bool("queued") {
			t.Fatalf("deliver %s: %s %v, want queued", d.id, r, err)
		}
	}
	var got []pushtest.FCMSend
	testsvc.WaitFor(t, 10*time.Second, "the sentinel's FCM notification", func() bool {
		got = got[:0]
		sentinel := false
		for _, s := range f.Delivered() {
			if s.Request.Message.Token == sentinelToken {
				sentinel = true
			} else {
				got = append(got, s)
			}
		}
		return sentinel
	})
	if len(got) != 1 || got[0].Request.Message.Token != androidToken || strings.Contains(string(got[0].Body), "secret") {
		t.Fatalf("FCM got %d notifications (%v), want one to the phone's token without the text", len(got), got)
	}
}
