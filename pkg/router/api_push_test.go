package router_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/push/pushtest"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
)

// TestPushRegistration: PUT /v1/devices/{device}/push registers a device's
// push endpoint (agent token only), a URL of exactly 2048 bytes is taken
// and one of 2049 is too_big, a bad target is bad_frame, and DELETE forgets
// it.
func TestPushRegistration(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		path := "/v1/devices/" + dev + "/push"
		base := "https://push.example/up/"
		exact := base + strings.Repeat("a", push.MaxURLBytes-len(base))

		wantError(t, e.call(t, "PUT", path, deliverToken, map[string]any{"kind": "webhook", "url": base}), http.StatusForbidden, "forbidden")
		wantError(t, e.call(t, "PUT", path, "", map[string]any{"kind": "webhook", "url": base}), http.StatusUnauthorized, "auth_failed")
		wantError(t, e.call(t, "PUT", path, agentToken, map[string]any{"kind": "unifiedpush", "url": exact + "a"}), http.StatusRequestEntityTooLarge, "too_big")
		for _, body := range []map[string]any{
			{"url": base},
			{"kind": "fcm", "url": base},
			{"kind": "webhook", "url": "not a url"},
			{"kind": "webhook"},
			{"kind": "ntfy", "url": "https://ntfy.sh/"},
		} {
			wantError(t, e.call(t, "PUT", path, agentToken, body), http.StatusBadRequest, "bad_frame")
		}
		if _, err := e.store.PushTarget(t.Context(), dev); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused registration was stored: %v", err)
		}
		wantError(t, e.call(t, "PUT", "/v1/devices/"+strings.Repeat("d", 121)+"/push", agentToken,
			map[string]any{"kind": "webhook", "url": base}), http.StatusBadRequest, "bad_frame")

		wantOK(t, e.call(t, "PUT", path, agentToken, map[string]any{"kind": "unifiedpush", "url": exact}))
		data, err := e.store.PushTarget(t.Context(), dev)
		var got push.Target
		if err != nil || json.Unmarshal(data, &got) != nil || got != (push.Target{Kind: "unifiedpush", URL: exact}) {
			t.Fatalf("stored target %s (%v), want the unifiedpush URL of 2048 bytes", data, err)
		}
		wantOK(t, e.call(t, "PUT", path, agentToken, map[string]any{"kind": "ntfy", "url": "https://ntfy.sh/hermes_x", "token": "tk_1"}))
		wantOK(t, e.call(t, "DELETE", path, agentToken, nil))
		if _, err := e.store.PushTarget(t.Context(), dev); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("after DELETE: %v, want no target", err)
		}
		wantOK(t, e.call(t, "DELETE", path, agentToken, nil))
		wantError(t, e.call(t, "POST", path, agentToken, nil), http.StatusMethodNotAllowed, "method_not_allowed")
	})
}

// wantRefused checks a 400 bad_frame whose message says why.
func wantRefused(t *testing.T, r response, why string) {
	t.Helper()
	wantError(t, r, http.StatusBadRequest, "bad_frame")
	if msg, _ := r.json(t)["message"].(string); !strings.Contains(msg, why) {
		t.Fatalf("message %q, want it to say %q", msg, why)
	}
}

// TestPushRegistrationRefusesAddresses: a push URL whose host is an
// address push may not reach, in any notation a resolver takes, is
// refused at registration with a 400 that says why: loopback (the
// router's own ports), metadata, link-local, unspecified, multicast and,
// by default, private addresses; a numeric host not written dotted
// decimal is refused even when public. Names and public addresses
// register.
func TestPushRegistrationRefusesAddresses(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		path := "/v1/devices/" + device("tel") + "/push"
		for _, tc := range []struct{ url, why string }{
			{"http://127.0.0.1:8081/admin", "127.0.0.1 is a loopback address"},
			{"http://2130706433/", "127.0.0.1 is a loopback address"},
			{"http://0x7f.1/", "127.0.0.1 is a loopback address"},
			{"http://0177.0.0.1/", "127.0.0.1 is a loopback address"},
			{"http://127.1:9090/metrics", "127.0.0.1 is a loopback address"},
			{"http://[::1]/", "loopback"},
			{"http://[::ffff:127.0.0.1]/", "loopback"},
			{"http://localhost:8081/admin", "loopback"},
			{"http://169.254.169.254/latest/meta-data/", "cloud metadata"},
			{"http://2852039166/latest/meta-data/", "169.254.169.254 is a cloud metadata address"},
			{"http://[fd00:ec2::254]/", "cloud metadata"},
			{"http://169.254.10.1/", "link-local"},
			{"http://[fe80::1%25eth0]/", "link-local"},
			{"http://0.0.0.0:8081/", "unspecified"},
			{"http://224.0.0.1/", "multicast"},
			{"http://10.0.0.5/", "private"},
			{"http://172.16.0.1/", "private"},
			{"http://192.168.1.10/hook", "private"},
			{"http://100.64.0.1/", "private"},
			{"http://[fd12::1]/", "private"},
			{"http://134744072/", "write it 8.8.8.8"},
		} {
			wantRefused(t, e.call(t, "PUT", path, agentToken, map[string]any{"kind": "webhook", "url": tc.url}), tc.why)
		}
		for _, u := range []string{"https://push.example/up/abc", "http://8.8.8.8/hook", "https://[2606:4700::1]/hook", "https://172.32.0.1/"} {
			wantOK(t, e.call(t, "PUT", path, agentToken, map[string]any{"kind": "webhook", "url": u}))
		}
	})
}

// TestPushRegistrationHeaderValues: an ntfy token becomes a header, so
// one with CR, LF or another control character, a space or a byte past
// ASCII is refused with a 400 that says so, as is one over 256 bytes; one
// of exactly 256 printable bytes registers.
func TestPushRegistrationHeaderValues(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		path := "/v1/devices/" + dev + "/push"
		ntfy := func(token string) map[string]any {
			return map[string]any{"kind": "ntfy", "url": "https://ntfy.example/hermes_1", "token": token}
		}
		for _, tc := range []struct{ token, why string }{
			{"tk_a\r\nX-Injected: 1", "control character"},
			{"tk_a\n", "control character"},
			{"tk_a\r", "control character"},
			{"tk_\x00", "control character"},
			{"tk_\t", "control character"},
			{"tk_\x7f", "control character"},
			{"tk a", "space or a non-ASCII byte"},
			{"tk_é", "space or a non-ASCII byte"},
			{strings.Repeat("k", 257), "longer than 256"},
		} {
			wantRefused(t, e.call(t, "PUT", path, agentToken, ntfy(tc.token)), tc.why)
		}
		if _, err := e.store.PushTarget(t.Context(), dev); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused registration was stored: %v", err)
		}
		token := strings.Repeat("k", 256)
		wantOK(t, e.call(t, "PUT", path, agentToken, ntfy(token)))
		data, err := e.store.PushTarget(t.Context(), dev)
		var got push.Target
		if err != nil || json.Unmarshal(data, &got) != nil || got.Token != token {
			t.Fatalf("stored target %s (%v), want the token of 256 bytes", data, err)
		}
	})
}

// pushServices are settings that turn FCM and APNs on, with the stand-ins'
// credentials (nothing is sent to them here).
func pushServices(t *testing.T) dispatch.PushServices {
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	return dispatch.PushServices{
		FCMCredentials: secret.Secret(f.Credentials()),
		APNsKey:        secret.Secret(a.KeyP8()), APNsKeyID: a.KeyID, APNsTeamID: a.TeamID, APNsTopic: a.Topic,
	}
}

// TestPushRegistrationServices: the router API registers the fcm and
// apns kinds, a token and no URL, when the service is configured, and
// refuses them, naming the setting, when it is not.
func TestPushRegistrationServices(t *testing.T) {
	put := func(base string, body map[string]any) response {
		return callURL(t, base, "PUT", "/v1/devices/tel-1/push", agentToken, body, nil)
	}
	off := pushAPI(t, dispatch.OutboxConfig{})
	wantRefused(t, put(off, map[string]any{"kind": "fcm", "token": "abc:APA91b"}), "MOBILE_PUSH_FCM_CREDENTIALS_FILE")
	wantRefused(t, put(off, map[string]any{"kind": "apns", "token": "0a1b"}), "MOBILE_PUSH_APNS_KEY_FILE")

	on := pushAPI(t, dispatch.OutboxConfig{PushServices: pushServices(t)})
	wantOK(t, put(on, map[string]any{"kind": "fcm", "token": "abc:APA91b"}))
	wantOK(t, put(on, map[string]any{"kind": "apns", "token": "0a1b2c3d"}))
	wantRefused(t, put(on, map[string]any{"kind": "apns", "token": "0a1b/../x"}), "hex")
	wantRefused(t, put(on, map[string]any{"kind": "fcm", "token": "abc", "url": "https://fcm.example/"}), "no url")
	wantRefused(t, put(on, map[string]any{"kind": "fcm"}), "token is missing")
}

// pushAPI serves the router API of a router whose outbox is of cfg (not
// started: only registrations are made) and returns its URL.
func pushAPI(t *testing.T, cfg dispatch.OutboxConfig) string {
	t.Helper()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	b, err := natsbus.Embedded(natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	o := dispatch.NewOutbox(cfg, st, b, nil)
	t.Cleanup(o.Close)
	r := router.New(router.Config{Outbox: o}, st, b, agent.Demo{}, nil)
	t.Cleanup(func() { r.Close() })
	api := router.NewAPI(r, apiConfig(nil))
	t.Cleanup(api.Close)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPushAllowSettings: MOBILE_PUSH_ALLOW_PRIVATE lets a LAN's ntfy
// register, not loopback nor metadata; MOBILE_PUSH_ALLOW_NETS lets
// exactly its networks, loopback included, never metadata; a network
// that does not parse is a configuration error naming the variable.
func TestPushAllowSettings(t *testing.T) {
	put := func(base, url string) response {
		return callURL(t, base, "PUT", "/v1/devices/tel-1/push", agentToken, map[string]any{"kind": "ntfy", "url": url}, nil)
	}
	private := pushAPI(t, dispatch.OutboxConfig{PushAllowPrivate: true})
	wantOK(t, put(private, "http://192.168.1.10/hermes_1"))
	wantOK(t, put(private, "http://[fd12::1]:8080/hermes_1"))
	wantRefused(t, put(private, "http://127.0.0.1/hermes_1"), "loopback")
	wantRefused(t, put(private, "http://169.254.169.254/hermes_1"), "cloud metadata")
	wantRefused(t, put(private, "http://100.100.100.200/hermes_1"), "cloud metadata")

	nets := pushAPI(t, dispatch.OutboxConfig{PushAllowNets: "127.0.0.1/32, 192.168.7.0/24, 169.254.0.0/16"})
	wantOK(t, put(nets, "http://127.0.0.1:8080/hermes_1"))
	wantOK(t, put(nets, "http://192.168.7.255/hermes_1"))
	wantRefused(t, put(nets, "http://127.0.0.2/hermes_1"), "loopback")
	wantRefused(t, put(nets, "http://192.168.8.0/hermes_1"), "private")
	wantRefused(t, put(nets, "http://169.254.169.254/hermes_1"), "cloud metadata")

	err := dispatch.OutboxConfig{PushAllowNets: "10.0.0.0/8,lan"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "MOBILE_PUSH_ALLOW_NETS") {
		t.Fatalf("Validate = %v, want an error naming MOBILE_PUSH_ALLOW_NETS", err)
	}
}
