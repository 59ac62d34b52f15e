package router_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/redis/go-redis/v9"
)

// TestDeliverTTL: a delivery to a device that is not online is refused
// (404 device_offline, the frame's device_offline) without a ttl, and
// kept with one: 202 {"queued":true} on the API, delivered
// {"queued":true} on the frame, and the device's next connection gets the
// text, the frame's text and the file, in the order sent. A ttl is a whole
// number of seconds from 1 to MOBILE_OUTBOX_TTL (24 h here): the bound
// passes, one second past it is 400 bad_frame, on both surfaces and for a
// batch's delivery.
func TestDeliverTTL(t *testing.T) {
	day := int(dispatch.DefaultOutboxTTL / time.Second)
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("sleeper")
		cron := e.phone(t, device("cron")) // loopback: may deliver
		frame := func(body map[string]any) client.Frame {
			t.Helper()
			body["t"] = protocol.TypeDeliver
			if err := cron.Send(body); err != nil {
				t.Fatal(err)
			}
			return nextAnswer(t, cron)
		}

		// Without a ttl: refused, nothing kept (the phone gets nothing of
		// "no-ttl" below).
		wantError(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "id": "no-ttl", "text": "lost"}),
			http.StatusNotFound, "device_offline")
		if f := frame(map[string]any{"target": dev, "id": "no-ttl-frame", "text": "lost"}); frameClass(t, f) != classOffline {
			t.Fatalf("deliver frame without ttl to an offline device: %s, want device_offline", f)
		}

		// Bad ttls, on both surfaces; nothing kept for them either.
		for _, ttl := range []any{0, -1, 1.5, "60", day + 1, true} {
			wantError(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "id": "bad", "text": "no", "ttl": ttl}),
				http.StatusBadRequest, "bad_frame")
			if f := frame(map[string]any{"target": dev, "id": "bad-frame", "text": "no", "ttl": ttl}); frameClass(t, f) != classBadFrame {
				t.Fatalf("deliver frame with ttl %v: %s, want bad_frame", ttl, f)
			}
		}

		// With a ttl, up to the bound: queued.
		queued := func(r response, id string) {
			t.Helper()
			if m := r.json(t); r.status != http.StatusAccepted || m["queued"] != true || m["id"] != id {
				t.Fatalf("deliver %s with a ttl to an offline device: %d %s, want 202 queued", id, r.status, r.body)
			}
		}
		queued(e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "id": "q-1", "text": "first", "ttl": day}), "q-1")
		if f := frame(map[string]any{"target": "mobile:" + dev, "id": "q-2", "text": "second", "ttl": 1}); f.T() != protocol.TypeDelivered || !f.Bool("queued") || f.Str("id") != "q-2" || f.Str("device") != dev {
			t.Fatalf("deliver frame with a ttl to an offline device: %s, want delivered queued", f)
		}
		queued(e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "id": "q-3", "ttl": 3600,
			"media": map[string]any{"kind": "document", "filename": "r.txt", "data": []byte("report")}}), "q-3")
		if e.redisURL != "" {
			// The file lives as long as its outbox item: an hour, not the
			// blobs' 15 minutes.
			opts, err := redis.ParseURL(e.redisURL)
			if err != nil {
				t.Fatal(err)
			}
			rdb := redis.NewClient(opts)
			defer rdb.Close()
			keys, err := rdb.Keys(t.Context(), e.redisPrefix+"blob:*").Result()
			if err != nil || len(keys) != 1 {
				t.Fatalf("blob keys %v (%v), want the queued file's", keys, err)
			}
			if ttl := rdb.PTTL(t.Context(), keys[0]).Val(); ttl < 59*time.Minute || ttl > time.Hour {
				t.Fatalf("the queued file's blob lives %v more, want its ttl of an hour", ttl)
			}
		}

		// A batch's deliveries take the ttl as a single POST does.
		r := e.call(t, "POST", "/v1/deliver/batch", deliverToken, map[string]any{"deliveries": []any{
			map[string]any{"target": dev, "id": "q-4", "text": "fourth", "ttl": 60},
			map[string]any{"target": dev, "id": "bad-batch", "text": "no", "ttl": day + 1},
			map[string]any{"target": dev, "id": "no-ttl-batch", "text": "lost"},
		}})
		results, _ := r.json(t)["results"].([]any)
		want := []string{`{"id":"q-4","queued":true,"status":202}`, `"bad_frame"`, `"device_offline"`}
		if r.status != http.StatusOK || len(results) != len(want) {
			t.Fatalf("batch: %d %s", r.status, r.body)
		}
		for i, res := range results {
			got, _ := json.Marshal(res)
			if !strings.Contains(string(got), want[i]) {
				t.Fatalf("batch result %d: %s, want %s", i, got, want[i])
			}
		}

		// The next connection gets them, in order, and acks them.
		phone := e.phoneWith(t, dev, client.Options{Timeout: 5 * time.Second, AutoAck: true})
		var got []string
		ctx := ctxFor(t, 20*time.Second)
		for len(got) < 4 {
			f, err := phone.Next(ctx)
			if err != nil {
				t.Fatalf("the phone got %v, then: %v", got, err)
			}
			id := f.Str("id")
			switch f.T() {
			case protocol.TypeMessage:
				if strings.HasPrefix(id, "no-ttl") || strings.HasPrefix(id, "bad") {
					t.Fatalf("the phone got %s, refused without being kept", f)
				}
			case protocol.TypeMedia:
				if data, err := base64.StdEncoding.DecodeString(f.Str("data")); err != nil || string(data) != "report" {
					t.Fatalf("the kept file arrived as %s", f)
				}
			default:
				continue
			}
			got = append(got, id)
		}
		if want := []string{"q-1", "q-2", "q-3-media", "q-4"}; !slices.Equal(got, want) {
			t.Fatalf("the phone got %v, want %v", got, want)
		}
	})
}
