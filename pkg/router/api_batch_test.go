package router_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
)

// batchAnswer is the body of a 200 from POST /v1/deliver/batch.
type batchAnswer struct {
	Results []struct {
		ID     string `json:"id"`
		Status int    `json:"status"`
		Error  *struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		} `json:"error"`
	} `json:"results"`
}

func postBatch(t *testing.T, e *env, items []json.RawMessage) batchAnswer {
	t.Helper()
	body, err := json.Marshal(map[string]any{"deliveries": items})
	if err != nil {
		t.Fatal(err)
	}
	r := e.call(t, "POST", "/v1/deliver/batch", deliverToken, body)
	if r.status != http.StatusOK {
		t.Fatalf("POST /v1/deliver/batch: %d %s, want 200", r.status, r.body)
	}
	var a batchAnswer
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatal(err)
	}
	if len(a.Results) != len(items) {
		t.Fatalf("%d results for %d deliveries: %s", len(a.Results), len(items), r.body)
	}
	return a
}

// TestDeliverBatchItemsAnswerAsSinglePosts: a batch mixing good,
// malformed, offline, too-long-device and duplicate deliveries answers
// each with the status and error code a POST /v1/deliver of it answers,
// and a bad one fails nobody else: the phones get every good one.
func TestDeliverBatchItemsAnswerAsSinglePosts(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		silent, acks, offline := device("silent"), device("acks"), device("gone")
		silentPhone := e.phone(t, silent)
		acksPhone := e.phoneWith(t, acks, client.Options{Timeout: 5 * time.Second, AutoAck: true})
		at := strings.Repeat("é", protocol.MaxDeviceFieldChars)
		file := base64.StdEncoding.EncodeToString([]byte("a file"))
		// Each item has the id "ID" (replaced per surface), or is raw JSON
		// that is not a delivery at all.
		items := []string{
			`{"target":"mobile:` + silent + `","id":"ID","text":"one"}`,
			`{"target":"` + acks + `","id":"ID","text":"two"}`,
			`{"target":"mobile:` + acks + `","id":"ID","text":"acked","wait":"ack"}`,
			`{"target":"mobile:` + silent + `","id":"ID","text":"not acked","wait":"ack"}`,
			`{"target":"mobile:` + offline + `","id":"ID","text":"nobody"}`,
			`{"target":"mobile:` + offline + `","id":"ID","media":{"kind":"image","data":"` + file + `"}}`,
			`{"target":"mobile:` + at + `","id":"ID","text":"120 characters"}`,
			`{"target":"mobile:` + at + `x","id":"ID","text":"121 characters"}`,
			`{"target":"mobile:` + silent + `","id":"ID","text":"with a file","media":{"kind":"document","filename":"a.txt","data":"` + file + `"}}`,
			`{"target":"mobile:` + silent + `","id":"ID"}`,
			`{"target":5,"id":"ID","text":"target not a string"}`,
			`{"target":"mobile:` + silent + `","id":"ID","text":"` + strings.Repeat("é", protocol.MaxTextChars+1) + `"}`,
			`{"target":"mobile:` + silent + `","id":"ID","media":{"kind":"audio","data":"` + file + `"}}`,
			`{"target":"mobile:` + silent + `","id":"ID","text":"x","wait":"read"}`,
			`{"target":"","id":"ID","text":"no home device"}`,
			`"not an object"`,
			`{"target":"mobile:` + silent + `","id":"dup","text":"duplicate"}`,
			`{"target":"mobile:` + silent + `","id":"dup","text":"duplicate"}`,
			`{"target":"mobile:` + acks + `","id":"ID","text":"last"}`,
		}
		batch := make([]json.RawMessage, len(items))
		for i, it := range items {
			batch[i] = json.RawMessage(strings.Replace(it, `"ID"`, fmt.Sprintf(`"b%d"`, i), 1))
		}
		got := postBatch(t, e, batch)
		for i, it := range items {
			single := e.call(t, "POST", "/v1/deliver", deliverToken, strings.Replace(it, `"ID"`, fmt.Sprintf(`"s%d"`, i), 1))
			res := got.Results[i]
			code := ""
			if res.Error != nil {
				code = res.Error.Error
			}
			wantCode, _ := single.json(t)["error"].(string)
			if res.Status != single.status || code != wantCode {
				t.Errorf("item %d %.80s: batch answered %d %q, a single POST %d %q (%s)", i, it, res.Status, code, single.status, wantCode, single.body)
			}
			if strings.Contains(it, `"ID"`) && res.Status < 300 && res.ID != fmt.Sprintf("b%d", i) {
				t.Errorf("item %d answered id %q, want b%d", i, res.ID, i)
			}
		}
		// Spot checks that the comparison is not of two wrong answers.
		for i, want := range map[int]int{0: 200, 2: 200, 3: 202, 4: 404, 7: 400, 11: 413, 15: 400, 16: 200, 17: 200} {
			if got.Results[i].Status != want {
				t.Errorf("item %d: %d, want %d", i, got.Results[i].Status, want)
			}
		}
		// The phones got the batch's good deliveries.
		for _, id := range []string{"b0", "b3", "b8", "dup"} {
			if _, _, err := silentPhone.CollectMessage(ctxFor(t, 10*time.Second), id); err != nil {
				t.Errorf("the silent phone did not get %s: %v", id, err)
			}
		}
		for _, id := range []string{"b1", "b2", "b18"} {
			if _, _, err := acksPhone.CollectMessage(ctxFor(t, 10*time.Second), id); err != nil {
				t.Errorf("the acking phone did not get %s: %v", id, err)
			}
		}
	})
}

// TestDeliverBatchKeepsOrderPerDevice: the deliveries of one device reach
// it in the batch's order, also around a file (sent alone) and with other
// devices' deliveries interleaved.
func TestDeliverBatchKeepsOrderPerDevice(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		const perDevice = 60
		devs := []string{device("a"), device("b"), device("c")}
		phones := make([]*client.Conn, len(devs))
		for k, d := range devs {
			phones[k] = e.phone(t, d)
		}
		file := base64.StdEncoding.EncodeToString([]byte("a file"))
		var items []json.RawMessage
		for i := range perDevice {
			for k, d := range devs {
				item := map[string]any{"target": "mobile:" + d, "id": fmt.Sprintf("%d-%d", k, i), "text": fmt.Sprintf("n%d", i)}
				if k == 1 && i == perDevice/2 {
					item["media"] = map[string]any{"kind": "document", "filename": "f.txt", "data": file}
				}
				data, _ := json.Marshal(item)
				items = append(items, data)
			}
		}
		for i, r := range postBatch(t, e, items).Results {
			if r.Status != http.StatusOK {
				t.Fatalf("item %d: %d %+v", i, r.Status, r.Error)
			}
		}
		for k, phone := range phones {
			next := 0
			ctx := ctxFor(t, 20*time.Second)
			for next < perDevice {
				f, err := phone.Next(ctx)
				if err != nil {
					t.Fatalf("device %d: after %d messages: %v", k, next, err)
				}
				if f.T() != protocol.TypeMessage {
					continue
				}
				if want := fmt.Sprintf("%d-%d", k, next); f.Str("id") != want {
					t.Fatalf("device %d got message %s, want %s next", k, f.Str("id"), want)
				}
				next++
			}
		}
	})
}

// TestDeliverBatchBounds: exactly MaxBatchItems deliveries and exactly
// MaxBatchBytes of body are read; one more of either is 413 too_big. An
// empty batch or a body without deliveries is 400 bad_frame.
func TestDeliverBatchBounds(t *testing.T) {
	const maxBytes = 64 << 10
	e := startCluster(t, apiConfig(func(c *router.APIConfig) { c.MaxBatchBytes = maxBytes }))
	dev := device("tel")
	e.phone(t, dev)
	items := func(n int) []byte {
		var b bytes.Buffer
		b.WriteString(`{"deliveries":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"target":%q,"text":"m"}`, dev)
		}
		b.WriteString("]}")
		return b.Bytes()
	}
	// The default bound of items: 1,000.
	e1000 := startCluster(t, apiConfig(nil))
	dev1000 := device("tel")
	e1000.phone(t, dev1000)
	all := bytes.ReplaceAll(items(1000), []byte(dev), []byte(dev1000))
	r := e1000.call(t, "POST", "/v1/deliver/batch", deliverToken, all)
	var a batchAnswer
	if r.status != http.StatusOK || json.Unmarshal(r.body, &a) != nil || len(a.Results) != 1000 {
		t.Fatalf("1,000 deliveries: %d %.300s, want 200 with 1,000 results", r.status, r.body)
	}
	for i, res := range a.Results {
		if res.Status != http.StatusOK {
			t.Fatalf("delivery %d of 1,000: %d %+v", i, res.Status, res.Error)
		}
	}
	wantError(t, e1000.call(t, "POST", "/v1/deliver/batch", deliverToken, bytes.ReplaceAll(items(1001), []byte(dev), []byte(dev1000))),
		http.StatusRequestEntityTooLarge, "too_big")

	// Bytes: a body padded to exactly maxBytes is read, one byte more is not.
	padded := func(size int) []byte {
		b := items(3)
		return append(b, bytes.Repeat([]byte(" "), size-len(b))...)
	}
	r = e.call(t, "POST", "/v1/deliver/batch", deliverToken, padded(maxBytes))
	if r.status != http.StatusOK {
		t.Fatalf("a batch of exactly %d bytes: %d %s, want 200", maxBytes, r.status, r.body)
	}
	wantError(t, e.call(t, "POST", "/v1/deliver/batch", deliverToken, padded(maxBytes+1)), http.StatusRequestEntityTooLarge, "too_big")

	wantError(t, e.call(t, "POST", "/v1/deliver/batch", deliverToken, `{"deliveries":[]}`), http.StatusBadRequest, "bad_frame")
	wantError(t, e.call(t, "POST", "/v1/deliver/batch", deliverToken, `{"deliveries":5}`), http.StatusBadRequest, "bad_frame")
	wantError(t, e.call(t, "POST", "/v1/deliver/batch", deliverToken, `{}`), http.StatusBadRequest, "bad_frame")
	wantError(t, e.call(t, "POST", "/v1/deliver/batch", agentToken, items(1)), http.StatusForbidden, "forbidden")
}
