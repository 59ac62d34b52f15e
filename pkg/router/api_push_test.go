package router_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/store"
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
