package router_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
)

// TestPromptTTLBounds: a card's ttl is its lifetime in whole seconds up to
// MOBILE_PROMPT_MAX_TTL (24 h by default): exactly the bound passes, one
// second past it is 400 bad_frame, as is anything below -1; -1 is the
// bound itself, 0 or no ttl is MOBILE_PROMPT_TTL (300 s); timeout_seconds
// only ever shortens the lifetime (alone it stays capped at
// MOBILE_PROMPT_TTL, as before ttl). The phone's card says the lifetime.
func TestPromptTTLBounds(t *testing.T) {
	day := int(router.DefaultPromptMaxTTL / time.Second)
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("ttl")
		phone := e.phone(t, dev)
		prompts := "/v1/sessions/mobile:" + dev + "/prompts"
		for _, tc := range []struct {
			body map[string]any
			want int // the card's timeout_seconds
		}{
			{map[string]any{"ttl": day}, day},
			{map[string]any{"ttl": -1}, day},
			{map[string]any{"ttl": 898}, 898},
			{map[string]any{"ttl": 0}, 300},
			{map[string]any{}, 300},
			{map[string]any{"ttl": 900, "timeout_seconds": 60}, 60},
			{map[string]any{"ttl": 60, "timeout_seconds": 900}, 60},
			{map[string]any{"timeout_seconds": 900}, 300},
			{map[string]any{"timeout_seconds": 7}, 7},
		} {
			tc.body["kind"], tc.body["text"] = "clarify", "Which city?"
			id, _ := wantOK(t, e.call(t, "POST", prompts, agentToken, tc.body))["id"].(string)
			card := expect(t, phone, protocol.TypePrompt)
			if card.Str("id") != id || card.Int("timeout_seconds") != tc.want {
				t.Fatalf("%v: card %s, want %s with timeout_seconds %d", tc.body, card, id, tc.want)
			}
		}
		for _, ttl := range []any{day + 1, -2, 1.5, "60", true} {
			r := e.call(t, "POST", prompts, agentToken, map[string]any{"kind": "clarify", "text": "?", "ttl": ttl})
			wantError(t, r, http.StatusBadRequest, "bad_frame")
			if ttl == day+1 && !strings.Contains(string(r.body), "MOBILE_PROMPT_MAX_TTL") {
				t.Fatalf("ttl one past the bound: %s, want the bound named", r.body)
			}
		}
	})
}

// startSingleAt is startSingle on clk, with the router's cfg: the node's
// store and router expire cards by clk. Journal leases and owner records
// expire by the same clock, so they are set longer than any jump of it.
func startSingleAt(t *testing.T, clk clock.Clock, rc router.Config) *env {
	t.Helper()
	nc := nodeConfig()
	nc.Router, nc.NewAgent, nc.APIListen, nc.API = true, agent.Named("link", agent.OpenAIConfig{}, 0), "127.0.0.1:0", apiConfig(nil)
	nc.Clock, nc.RouterCfg = clk, rc
	nc.RouterCfg.JournalLease, nc.Edge.OwnerTTL = 48*time.Hour, 48*time.Hour
	g, err := gateway.Start(t.Context(), nc, testLogger(t, "node"))
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return &env{node: g, router: g.Router, store: g.Store, api: g.API, url: g.APIURL()}
}

// TestPromptTTLExpiry: with MOBILE_PROMPT_MAX_TTL set to an hour, a card
// lives exactly what it asked for, on a clock only the test moves: ttl 898
// (Hermes's approvals.timeout 900 less the plugin's margin) is answered a
// microsecond before 898 s and expires at 898 s, not before; ttl -1 (a
// clarify without a limit) lives the hour, until answered or closed, as
// does ttl 3600, the bound; no ttl lives MOBILE_PROMPT_TTL (300 s); 3601
// is 400.
func TestPromptTTLExpiry(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	e := startSingleAt(t, clk, router.Config{PromptMaxTTL: time.Hour})
	dev := device("ttlclock")
	phone := e.phoneWith(t, dev, client.Options{Timeout: 5 * time.Second})
	prompts := "/v1/sessions/mobile:" + dev + "/prompts"
	open := func(body map[string]any) string {
		t.Helper()
		body["kind"], body["text"] = "exec_approval", "Run this command?"
		id, _ := wantOK(t, e.call(t, "POST", prompts, agentToken, body))["id"].(string)
		if card := expect(t, phone, protocol.TypePrompt); card.Str("id") != id {
			t.Fatalf("card %s, want %s", card, id)
		}
		return id
	}
	wantError(t, e.call(t, "POST", prompts, agentToken, map[string]any{"kind": "clarify", "text": "?", "ttl": 3601}),
		http.StatusBadRequest, "bad_frame")
	defaultCard := open(map[string]any{})
	answered, expiring := open(map[string]any{"ttl": 898}), open(map[string]any{"ttl": 898})
	answeredLong, expiringLong := open(map[string]any{"ttl": 3600}), open(map[string]any{"ttl": -1})

	done := func(id string, expired bool) {
		t.Helper()
		f := expect(t, phone, protocol.TypePromptDone)
		if f.Str("id") != id || f.Bool("expired") != expired {
			t.Fatalf("prompt_done %s, want %s expired=%v", f, id, expired)
		}
	}
	clk.Advance(300 * time.Second)
	done(defaultCard, true)

	clk.Advance(598*time.Second - time.Microsecond) // 898 s less a microsecond
	if err := phone.Answer(answered, "once", ""); err != nil {
		t.Fatal(err)
	}
	done(answered, false)
	clk.Advance(time.Microsecond)
	done(expiring, true)

	clk.Advance(time.Hour - 898*time.Second - time.Microsecond)
	if err := phone.Answer(answeredLong, "once", ""); err != nil {
		t.Fatal(err)
	}
	done(answeredLong, false)
	clk.Advance(time.Microsecond)
	done(expiringLong, true)
}
