package router_test

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
)

func TestDeliver(t *testing.T) {
	home := device("home")
	eachEnv(t, func(c *router.APIConfig) { c.HomeDevice = home }, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		homePhone := e.phone(t, home)

		for _, target := range []string{"mobile:" + dev, dev} {
			r := e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": target, "id": "cron-" + target, "text": "cron to " + target})
			if id := wantOK(t, r)["id"]; id != "cron-"+target {
				t.Fatalf("deliver answered id %v, want the one given", id)
			}
			msg := expect(t, phone, protocol.TypeMessage)
			if msg.Str("text") != "cron to "+target || !msg.Bool("final") || msg.Str("id") != "cron-"+target {
				t.Fatalf("delivered %s", msg)
			}
		}

		// No target: the home device; no id: one is made.
		r := e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"text": "to home"})
		id, _ := wantOK(t, r)["id"].(string)
		if id == "" {
			t.Fatalf("deliver without id answered %s, want the id it made", r.body)
		}
		if msg := expect(t, homePhone, protocol.TypeMessage); msg.Str("text") != "to home" || msg.Str("id") != id {
			t.Fatalf("delivered to home %s", msg)
		}

		// Media: the bytes reach the phone, as a file of the id + "-media".
		file := bytes.Repeat([]byte("0123456789abcdef"), 210_000) // 3.4 MB: two chunks
		r = e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{
			"target": "mobile:" + dev, "id": "cron-media", "text": "a report",
			"media": map[string]any{"kind": "Document", "filename": "report.txt", "data": file},
		})
		wantOK(t, r)
		if msg := expect(t, phone, protocol.TypeMessage); msg.Str("text") != "a report" {
			t.Fatalf("delivered %s", msg)
		}
		meta, data, err := phone.CollectMedia(ctxFor(t, 10*time.Second), "cron-media-media")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, file) || meta.Str("kind") != "document" || meta.Str("filename") != "report.txt" || meta.Str("mime") != "text/plain; charset=utf-8" {
			t.Fatalf("delivered file %s with %d bytes, want %d", meta, len(data), len(file))
		}

		// A device that is not online: device_offline, and nothing kept.
		gone := device("gone")
		wantError(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": gone, "text": "hello?"}),
			http.StatusNotFound, "device_offline")
		wantError(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": gone,
			"media": map[string]any{"kind": "image", "data": []byte("png")}}), http.StatusNotFound, "device_offline")
		later := e.phone(t, gone)
		if err := later.Ping(1); err != nil {
			t.Fatal(err)
		}
		if f := expect(t, later, protocol.TypePong); f.Int("ts") != 1 {
			t.Fatalf("pong %s", f)
		}
		if f, _ := later.Next(ctxFor(t, 300*time.Millisecond)); !f.IsZero() {
			t.Fatalf("a device that was offline got %s: deliver must not use the outbox", f)
		}
	})
}

// TestDeliverWaitAck: with "wait":"ack" the answer is 200 only once the
// phone acknowledged the message, 202 when it did not within the edge's
// AckWait; without it, a phone that acks (it has sent an ack on its
// socket) gets the same treatment, and one that never acks gets 200 once
// written, as before.
func TestDeliverWaitAck(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		deliver := func(id string, wait bool) <-chan response {
			body := map[string]any{"target": dev, "id": id, "text": "text " + id}
			if wait {
				body["wait"] = "ack"
			}
			res := make(chan response, 1)
			go func() { res <- e.call(t, "POST", "/v1/deliver", deliverToken, body) }()
			return res
		}
		status := func(res <-chan response, id string, want int) {
			t.Helper()
			r := <-res
			if r.status != want || r.json(t)["id"] != id {
				t.Fatalf("deliver %s: %d %s, want %d", id, r.status, r.body, want)
			}
		}

		// A phone that has never acked: written is enough, unless asked.
		r := deliver("plain", false)
		expect(t, phone, protocol.TypeMessage)
		status(r, "plain", http.StatusOK)
		r = deliver("unacked", true)
		expect(t, phone, protocol.TypeMessage)
		status(r, "unacked", http.StatusAccepted)

		r = deliver("acked", true)
		if msg := expect(t, phone, protocol.TypeMessage); msg.Str("id") != "acked" {
			t.Fatalf("got %s", msg)
		}
		if err := phone.Ack("acked"); err != nil {
			t.Fatal(err)
		}
		status(r, "acked", http.StatusOK)

		// It acks now: a delivery it does not ack was not delivered.
		r = deliver("ignored", false)
		expect(t, phone, protocol.TypeMessage)
		status(r, "ignored", http.StatusAccepted)

		wantError(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "text": "x", "wait": "read"}),
			http.StatusBadRequest, "bad_frame")
	})
}

func TestDeliverRejects(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		e.phone(t, dev)
		deliver := func(body any) response {
			t.Helper()
			return e.call(t, "POST", "/v1/deliver", deliverToken, body)
		}
		big := strings.Repeat("é", protocol.MaxTextChars+1)
		for _, tc := range []struct {
			name   string
			body   any
			status int
			code   string
		}{
			{"neither text nor media", map[string]any{"target": dev}, 400, "bad_frame"},
			{"empty body", "", 400, "bad_frame"},
			{"not JSON", "target=x&text=y", 400, "bad_frame"},
			{"a JSON array", "[]", 400, "bad_frame"},
			{"text not a string", map[string]any{"target": dev, "text": 5}, 400, "bad_frame"},
			{"media without kind", map[string]any{"target": dev, "media": map[string]any{"data": []byte("x")}}, 400, "bad_frame"},
			{"media without data", map[string]any{"target": dev, "media": map[string]any{"kind": "image"}}, 400, "bad_frame"},
			{"media data not base64", map[string]any{"target": dev, "media": map[string]any{"kind": "image", "data": "%%%"}}, 400, "bad_frame"},
			{"media kind of uploads only", map[string]any{"target": dev, "media": map[string]any{"kind": "audio", "data": []byte("x")}}, 400, "unsupported_frame"},
			{"unknown media kind", map[string]any{"target": dev, "media": map[string]any{"kind": "sticker", "data": []byte("x")}}, 400, "unsupported_frame"},
			{"text over 12000 characters", map[string]any{"target": dev, "text": big}, 413, "too_big"},
			{"media over 8 MiB", mediaJSON(dev, protocol.MaxMediaBytes+1), 413, "too_big"},
			{"body over 12 MiB", `{"target":"` + dev + `","text":"` + strings.Repeat("x", 13<<20) + `"}`, 413, "too_big"},
			{"no target and no home device", map[string]any{"text": "x"}, 400, "bad_frame"},
			{"a device id no device has", map[string]any{"target": strings.Repeat("d", 121), "text": "x"}, 400, "bad_frame"},
		} {
			t.Run(tc.name, func(t *testing.T) { wantError(t, deliver(tc.body), tc.status, tc.code) })
		}
		// Exactly at the limits is fine.
		wantOK(t, deliver(map[string]any{"target": dev, "text": strings.Repeat("é", protocol.MaxTextChars)}))
		wantOK(t, deliver(mediaJSON(dev, protocol.MaxMediaBytes)))
	})
}

func TestAuth(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		endpoints := []struct {
			method, path string
			token        string // the one that may call it
		}{
			{"POST", "/v1/deliver", deliverToken},
			{"POST", "/v1/sessions/mobile:" + dev + "/messages", agentToken},
			{"POST", "/v1/sessions/" + dev + "/media", agentToken},
			{"POST", "/v1/sessions/mobile:" + dev + "/prompts", agentToken},
			{"POST", "/v1/sessions/mobile:" + dev + "/typing", agentToken},
			{"POST", "/v1/sessions/mobile:" + dev + "/avatar", agentToken},
			{"GET", "/v1/events?wait=0", agentToken},
			{"GET", "/v1/blobs/0123456789abcdef", agentToken},
		}
		for _, ep := range endpoints {
			t.Run(ep.method+" "+ep.path, func(t *testing.T) {
				r := e.call(t, ep.method, ep.path, "", `{"text":"x"}`)
				wantError(t, r, http.StatusUnauthorized, "auth_failed")
				if r.header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
				wantError(t, e.call(t, ep.method, ep.path, "wrong-token", `{"text":"x"}`), http.StatusUnauthorized, "auth_failed")
				wantError(t, e.call(t, ep.method, ep.path, ep.token+"x", `{"text":"x"}`), http.StatusUnauthorized, "auth_failed")
				wantError(t, callURL(t, e.url, ep.method, ep.path, "", `{"text":"x"}`, http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+ep.token))}}),
					http.StatusUnauthorized, "auth_failed")
				other := agentToken
				if ep.token == agentToken {
					other = deliverToken
				}
				wantError(t, e.call(t, ep.method, ep.path, other, `{"text":"x"}`), http.StatusForbidden, "forbidden")
				// The right token passes the check (what follows is the endpoint's business).
				if r := e.call(t, ep.method, ep.path, ep.token, `{"text":"x"}`); r.status == http.StatusUnauthorized || r.status == http.StatusForbidden {
					t.Fatalf("the right token got %d: %s", r.status, r.body)
				}
			})
		}
		// Both deliver tokens work.
		e.phone(t, dev)
		wantOK(t, e.call(t, "POST", "/v1/deliver", "other-deliver-token", map[string]any{"target": dev, "text": "x"}))
		// The scheme is case-insensitive, as HTTP says.
		wantOK(t, callURL(t, e.url, "POST", "/v1/deliver", "", map[string]any{"target": dev, "text": "x"},
			http.Header{"Authorization": {"bearer " + deliverToken}}))

		// Unknown paths and wrong methods answer JSON too.
		wantError(t, e.call(t, "GET", "/v1/nothing", agentToken, nil), http.StatusNotFound, "not_found")
		r := e.call(t, "GET", "/v1/deliver", deliverToken, nil)
		wantError(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
		if r.header.Get("Allow") != "POST" {
			t.Fatalf("405 with Allow %q, want POST", r.header.Get("Allow"))
		}
		wantError(t, e.call(t, "DELETE", "/v1/events", agentToken, nil), http.StatusMethodNotAllowed, "method_not_allowed")
	})
}

// TestDeliverWithoutTokens: an API without tokens refuses everything but
// the health checks.
func TestDeliverWithoutTokens(t *testing.T) {
	e := startSingle(t, router.APIConfig{DeliverTokens: []string{"", " "}})
	for _, tok := range []string{"", " ", "x"} {
		wantError(t, e.call(t, "POST", "/v1/deliver", tok, map[string]any{"target": "d", "text": "x"}), http.StatusUnauthorized, "auth_failed")
		wantError(t, e.call(t, "GET", "/v1/events", tok, nil), http.StatusUnauthorized, "auth_failed")
	}
	wantOK(t, e.call(t, "GET", "/healthz", "", nil))
}

// mediaJSON is a deliver body with an image of n zero bytes, built without
// encoding/json (slow with -race for megabytes).
func mediaJSON(target string, n int) string {
	return `{"target":"` + target + `","media":{"kind":"image","data":"` + base64.StdEncoding.EncodeToString(make([]byte, n)) + `"}}`
}
