package router_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Outcome classes of a delivery, as both surfaces report them
// (docs/api.md): the frame's delivered or error code, the API's status.
const (
	classDelivered   = "delivered"         // frame delivered; 200
	classWritten     = "written"           // frame device_offline "…did not acknowledge…"; 202
	classOffline     = "offline"           // frame device_offline; 404 device_offline
	classBadFrame    = "bad_frame"         // 400 bad_frame
	classUnsupported = "unsupported_frame" // 400 unsupported_frame
	classTooBig      = "too_big"           // 413 too_big
)

// frameClass is the class of the answer a deliver frame got.
func frameClass(t *testing.T, f client.Frame) string {
	t.Helper()
	switch {
	case f.T() == protocol.TypeDelivered:
		return classDelivered
	case f.T() != protocol.TypeError:
		t.Fatalf("a deliver frame was answered with %s", f)
	case f.Str("code") == string(protocol.CodeDeviceOffline) && strings.Contains(f.Str("message"), "did not acknowledge"):
		return classWritten
	case f.Str("code") == string(protocol.CodeDeviceOffline):
		return classOffline
	}
	return f.Str("code")
}

// apiClass is the class of an answer of POST /v1/deliver.
func apiClass(t *testing.T, r response) string {
	t.Helper()
	switch {
	case r.status == http.StatusOK:
		return classDelivered
	case r.status == http.StatusAccepted:
		return classWritten
	case r.status == http.StatusNotFound && r.json(t)["error"] == string(protocol.CodeDeviceOffline):
		return classOffline
	}
	code, _ := r.json(t)["error"].(string)
	status := map[string]int{classBadFrame: 400, classUnsupported: 400, classTooBig: 413}[code]
	if status != r.status {
		t.Fatalf("POST /v1/deliver answered %d %s", r.status, r.body)
	}
	return code
}

// TestDeliverSurfacesAgree: every delivery is sent through both surfaces,
// a deliver frame on a real edge socket and POST /v1/deliver over real
// HTTP, and both give it the same outcome class: the one delivery path
// behind them (protocol.DeliverBody, dispatch.Deliverer) means the same
// on both. Limits are tried at the bound and one past it.
func TestDeliverSurfacesAgree(t *testing.T) {
	const (
		phoneNone   = iota // no phone: the target is offline
		phoneSilent        // online, never acks
		phoneAcks          // online, acks everything it shows
		phoneAcked         // online, has acked once, acks nothing more
	)
	media := func(kind string, n int) map[string]any {
		return map[string]any{"kind": kind, "filename": "f.bin", "data": base64.StdEncoding.EncodeToString(make([]byte, n))}
	}
	at := strings.Repeat("é", protocol.MaxDeviceFieldChars) // 120 characters, 240 bytes
	cases := []struct {
		name   string
		phone  int
		target func(dev string) any // nil: "mobile:" + dev
		body   map[string]any       // besides target and id
		noID   bool
		times  int // sent that many times with the same id (a duplicate); 1 when 0
		want   string
	}{
		{name: "text to a phone that does not ack", phone: phoneSilent, body: map[string]any{"text": "hi"}, want: classDelivered},
		{name: "bare device id", phone: phoneSilent, target: func(dev string) any { return dev }, body: map[string]any{"text": "hi"}, want: classDelivered},
		{name: "acking phone", phone: phoneAcks, body: map[string]any{"text": "hi"}, want: classDelivered},
		{name: "acking phone, wait ack", phone: phoneAcks, body: map[string]any{"text": "hi", "wait": "ack"}, want: classDelivered},
		{name: "silent phone, wait ack", phone: phoneSilent, body: map[string]any{"text": "hi", "wait": "ack"}, want: classWritten},
		{name: "phone that acked, not acking this one", phone: phoneAcked, body: map[string]any{"text": "hi"}, want: classWritten},
		{name: "offline", phone: phoneNone, body: map[string]any{"text": "hi"}, want: classOffline},
		{name: "offline, a file only", phone: phoneNone, body: map[string]any{"media": media("image", 3)}, want: classOffline},
		{name: "missing id", phone: phoneSilent, noID: true, body: map[string]any{"text": "hi"}, want: classDelivered},
		{name: "duplicate id", phone: phoneSilent, times: 2, body: map[string]any{"text": "hi"}, want: classDelivered},
		{name: "text and media", phone: phoneAcks, body: map[string]any{"text": "hi", "media": media("document", 10)}, want: classDelivered},
		{name: "text and media, silent, wait ack", phone: phoneSilent, body: map[string]any{"text": "hi", "media": media("image", 10), "wait": "ack"}, want: classWritten},
		{name: "neither text nor media", phone: phoneSilent, body: map[string]any{}, want: classBadFrame},
		{name: "no target and no home device", phone: phoneNone, target: func(string) any { return "" }, body: map[string]any{"text": "hi"}, want: classBadFrame},
		{name: "target mobile: alone", phone: phoneNone, target: func(string) any { return "mobile:" }, body: map[string]any{"text": "hi"}, want: classBadFrame},
		{name: "device id of 120 characters", phone: phoneNone, target: func(string) any { return "mobile:" + at }, body: map[string]any{"text": "hi"}, want: classOffline},
		{name: "device id of 121 characters", phone: phoneNone, target: func(string) any { return "mobile:" + at + "x" }, body: map[string]any{"text": "hi"}, want: classBadFrame},
		{name: "target not a string", phone: phoneNone, target: func(string) any { return 5 }, body: map[string]any{"text": "hi"}, want: classBadFrame},
		{name: "text of 12000 characters", phone: phoneSilent, body: map[string]any{"text": strings.Repeat("é", protocol.MaxTextChars)}, want: classDelivered},
		{name: "text of 12001 characters", phone: phoneSilent, body: map[string]any{"text": strings.Repeat("é", protocol.MaxTextChars+1)}, want: classTooBig},
		{name: "media of 8 MiB", phone: phoneNone, body: map[string]any{"media": media("image", protocol.MaxMediaBytes)}, want: classOffline},
		{name: "media of 8 MiB + 1", phone: phoneNone, body: map[string]any{"media": media("image", protocol.MaxMediaBytes+1)}, want: classTooBig},
		{name: "media kind of uploads only", phone: phoneSilent, body: map[string]any{"media": media("audio", 3)}, want: classUnsupported},
		{name: "media without data", phone: phoneSilent, body: map[string]any{"media": map[string]any{"kind": "image"}}, want: classBadFrame},
		{name: "wait other than ack", phone: phoneSilent, body: map[string]any{"text": "hi", "wait": "read"}, want: classBadFrame},
	}
	// One node and router per variant, the cases one after the other: ~25
	// nodes at once, with megabyte bodies, would starve a small machine.
	eachEnv(t, nil, func(t *testing.T, e *env) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				dev := device("tel")
				var phone *client.Conn
				switch tc.phone {
				case phoneSilent:
					phone = e.phone(t, dev)
				case phoneAcks:
					phone = e.phoneWith(t, dev, client.Options{Timeout: 5 * time.Second, AutoAck: true})
				case phoneAcked:
					phone = e.phone(t, dev)
					if err := phone.Ack("earlier"); err != nil {
						t.Fatal(err)
					}
					if err := phone.Ping(1); err != nil { // the edge reads in order: the ack is taken
						t.Fatal(err)
					}
					expect(t, phone, protocol.TypePong)
				}
				body := func(surface string) map[string]any {
					b := map[string]any{"target": "mobile:" + dev, "id": surface + "-1"}
					if tc.target != nil {
						b["target"] = tc.target(dev)
					}
					if tc.noID {
						delete(b, "id")
					}
					for k, v := range tc.body {
						b[k] = v
					}
					return b
				}
				cron := e.phone(t, device("cron")) // loopback: may deliver
				for range max(1, tc.times) {
					fb := body("frame")
					fb["t"] = protocol.TypeDeliver
					frame, err := json.Marshal(fb)
					if err != nil {
						t.Fatal(err)
					}
					if err := cron.SendRaw(frame); err != nil {
						t.Fatal(err)
					}
					f := nextAnswer(t, cron)
					if got := frameClass(t, f); got != tc.want {
						t.Errorf("deliver frame: %s (%s), want %s", got, f, tc.want)
					}
					req, err := json.Marshal(body("api"))
					if err != nil {
						t.Fatal(err)
					}
					if got := apiClass(t, e.call(t, "POST", "/v1/deliver", deliverToken, req)); got != tc.want {
						t.Errorf("POST /v1/deliver: %s, want %s", got, tc.want)
					}
				}
				if phone != nil && (tc.want == classDelivered || tc.want == classWritten) && !tc.noID && tc.body["text"] != nil {
					// Both surfaces wrote it to the phone, under their ids.
					for _, id := range []string{"frame-1", "api-1"} {
						if _, _, err := phone.CollectMessage(ctxFor(t, 10*time.Second), id); err != nil {
							t.Errorf("the phone did not get %s: %v", id, err)
						}
					}
				}
			})
		}
	})
}

// nextAnswer is the next frame on c other than avatar, typing and pong.
func nextAnswer(t *testing.T, c *client.Conn) client.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the deliver frame's answer: %v", err)
		}
		switch f.T() {
		case protocol.TypeAvatar, protocol.TypeTyping, protocol.TypePong:
			continue
		}
		return f
	}
}

// TestDeliverStoresNoFileForAnOfflineDevice: a file delivered to a device
// that is not online is refused (device_offline) on both surfaces before
// its bytes are stored: no blob key appears in Redis. A file delivered to
// an online device is stored (the scan sees blobs).
func TestDeliverStoresNoFileForAnOfflineDevice(t *testing.T) {
	e := startCluster(t, apiConfig(nil))
	opts, err := redis.ParseURL(e.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	blobs := func() int {
		t.Helper()
		keys, err := rdb.Keys(t.Context(), e.redisPrefix+"blob:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	file := map[string]any{"kind": "image", "filename": "a.png", "data": base64.StdEncoding.EncodeToString([]byte("png bytes"))}
	cron := e.phone(t, device("cron"))

	offline := device("gone")
	if err := cron.Send(map[string]any{"t": protocol.TypeDeliver, "id": "f", "target": "mobile:" + offline, "media": file}); err != nil {
		t.Fatal(err)
	}
	if f := nextAnswer(t, cron); frameClass(t, f) != classOffline {
		t.Fatalf("deliver frame of a file to an offline device: %s, want device_offline", f)
	}
	if got := apiClass(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"id": "a", "target": offline, "media": file})); got != classOffline {
		t.Fatalf("POST /v1/deliver of a file to an offline device: %s, want offline", got)
	}
	if n := blobs(); n != 0 {
		t.Fatalf("%d blobs stored for deliveries to an offline device, want none", n)
	}

	online := device("tel")
	phone := e.phone(t, online)
	if err := cron.Send(map[string]any{"t": protocol.TypeDeliver, "id": "f", "target": online, "media": file}); err != nil {
		t.Fatal(err)
	}
	if f := nextAnswer(t, cron); frameClass(t, f) != classDelivered {
		t.Fatalf("deliver frame of a file to an online device: %s, want delivered", f)
	}
	if _, data, err := phone.CollectMedia(ctxFor(t, 10*time.Second), "f-media"); err != nil || string(data) != "png bytes" {
		t.Fatalf("the phone got %q (%v)", data, err)
	}
	if n := blobs(); n != 1 {
		t.Fatalf("%d blobs stored for one file delivered to an online device, want 1", n)
	}
}
