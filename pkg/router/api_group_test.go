package router_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// The counters of POST /v1/deliver's requests to edges (dispatch.Groups).
const (
	aloneRequests = `hermes_deliver_requests_total{kind="alone"}`
	groupRequests = `hermes_deliver_requests_total{kind="group"}`
	groupedTotal  = `hermes_deliver_grouped_total`
)

// startGroups starts two edges on a shared Redis and NATS and a router
// whose metrics are served at the URL it returns; a delivery with "wait":
// "ack" waits 10 s for a phone that does not ack.
func startGroups(t *testing.T) (*env, string) {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "hermes-router"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	e := startClusterWith(t, apiConfig(nil), cluster{edges: 2, telemetry: tel, ackWait: 10 * time.Second})
	ms := httptest.NewServer(tel.Handler())
	t.Cleanup(ms.Close)
	return e, ms.URL + "/metrics"
}

// postAsync POSTs a delivery of body from a goroutine of its own; an
// answer of status 0 is a failed request, its error in body.
func postAsync(t *testing.T, e *env, body map[string]any) <-chan response {
	return postAsyncWith(t, e, body, nil)
}

// postAsyncWith is postAsync with header's fields in the request.
func postAsyncWith(t *testing.T, e *env, body map[string]any, header http.Header) <-chan response {
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 40*time.Second)
	res := make(chan response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/deliver", bytes.NewReader(data))
		for k, v := range header {
			req.Header[k] = v
		}
		req.Header.Set("Authorization", "Bearer "+deliverToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			res <- response{body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			res <- response{body: []byte(err.Error())}
			return
		}
		res <- response{resp.StatusCode, resp.Header, b}
	}()
	return res
}

// messageIDs reads the next n messages c gets and returns their ids, in
// the order they came.
func messageIDs(t *testing.T, c *client.Conn, n int) []string {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	var ids []string
	for len(ids) < n {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("after %d messages %v: %v", len(ids), ids, err)
		}
		if f.T() == protocol.TypeMessage {
			ids = append(ids, f.Str("id"))
		}
	}
	return ids
}

// waitFor waits until cond holds, for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// TestDeliverGroupsOverlappingCallers: single deliveries for an edge that
// arrive while a request to it is in flight wait and go together in one
// request, and each caller gets the answer it would have got alone: 200
// for the phones of two edges; 404 device_offline for devices with no
// owner record, for one whose edge is gone and for one whose edge holds
// no socket of it, and 202 queued for that one with a ttl. The first
// delivery for each edge (a "wait":"ack" its phone acks when the test
// says) goes alone and holds the edge's turn; the 40 that come meanwhile
// go in one request per edge once it is answered.
func TestDeliverGroupsOverlappingCallers(t *testing.T) {
	e, metrics := startGroups(t)
	groups := e.api.Groups()
	groups.SetHold(time.Minute) // a turn ends with its request's answer
	before := testsvc.Scrape(t, metrics)

	const perDevice = 3
	type target struct {
		dev   string
		phone *client.Conn
	}
	var online []target
	var holders []*client.Conn
	var holderDevs []string
	for k, node := range e.nodes {
		holder := device(fmt.Sprintf("holder%d", k))
		holderDevs = append(holderDevs, holder)
		holders = append(holders, phoneOn(t, node, holder, client.Options{Timeout: 5 * time.Second}))
		for i := range 6 {
			dev := device(fmt.Sprintf("e%d-%d", k, i))
			online = append(online, target{dev, phoneOn(t, node, dev, client.Options{Timeout: 5 * time.Second, AutoAck: true})})
		}
	}
	offline := []string{device("off-1"), device("off-2")}
	// A ghost's owner record names a live edge that holds no socket of it
	// (the socket closed a moment ago): its group's edge answers "moved",
	// and alone it is not connected: offline, or kept with a ttl.
	var ghosts []string
	for k, node := range e.nodes {
		ghost := device(fmt.Sprintf("ghost%d", k))
		ghosts = append(ghosts, ghost)
		if _, err := e.store.ClaimDevice(t.Context(), tenant.DeviceKey(tenant.Legacy, ghost), node.Edge.ID(), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	dead := device("dead") // held by an edge that is gone
	if _, err := e.store.ClaimDevice(t.Context(), tenant.DeviceKey(tenant.Legacy, dead), "edge-gone-"+testsvc.RandomHex(3), time.Minute); err != nil {
		t.Fatal(err)
	}

	// Each edge's turn is held by a delivery its phone has not acked.
	var lead []<-chan response
	for k, h := range holders {
		id := fmt.Sprintf("lead-%d", k)
		lead = append(lead, postAsync(t, e, map[string]any{"target": holderDevs[k], "id": id, "text": "first", "wait": "ack"}))
		if got := messageIDs(t, h, 1); got[0] != id {
			t.Fatalf("holder %d got %v, want %s", k, got, id)
		}
	}

	type call struct {
		id, dev string
		res     <-chan response
	}
	var calls []call
	start := make(chan struct{})
	var wg sync.WaitGroup
	add := func(dev, id string, ttl int) {
		res := make(chan response, 1)
		calls = append(calls, call{id, dev, res})
		body := map[string]any{"target": dev, "id": id, "text": "text " + id}
		if ttl > 0 {
			body["ttl"] = ttl
		}
		wg.Go(func() {
			<-start
			res <- <-postAsync(t, e, body)
		})
	}
	for _, o := range online {
		for i := range perDevice {
			add(o.dev, fmt.Sprintf("%s-%d", o.dev, i), 0)
		}
	}
	for _, dev := range append(offline, dead) {
		add(dev, dev+"-0", 0)
	}
	for _, ghost := range ghosts {
		add(ghost, ghost+"-0", 0)
		add(ghost, ghost+"-kept", 60)
	}
	close(start)
	grouped := len(online)*perDevice + 2*len(ghosts)
	waitFor(t, fmt.Sprintf("%d deliveries waiting for their edges' turns", grouped), func() bool { return groups.Waiting() == grouped })

	for k, h := range holders {
		if err := h.Ack(fmt.Sprintf("lead-%d", k)); err != nil {
			t.Fatal(err)
		}
	}
	for k, r := range lead {
		if r := <-r; r.status != http.StatusOK {
			t.Fatalf("the delivery that held edge %d's turn: %d %s", k, r.status, r.body)
		}
	}
	wg.Wait()
	for _, c := range calls {
		r := <-c.res
		switch {
		case slices.Contains(ghosts, c.dev) && c.id == c.dev+"-kept":
			if m := r.json(t); r.status != http.StatusAccepted || m["queued"] != true || m["id"] != c.id {
				t.Fatalf("a delivery with a ttl to a device not connected: %d %s, want 202 queued", r.status, r.body)
			}
		case slices.Contains(offline, c.dev), c.dev == dead, slices.Contains(ghosts, c.dev):
			wantError(t, r, http.StatusNotFound, "device_offline")
		default:
			if m := wantOK(t, r); m["id"] != c.id {
				t.Fatalf("delivery %s answered for %v", c.id, m["id"])
			}
		}
	}
	for _, o := range online {
		got := messageIDs(t, o.phone, perDevice)
		slices.Sort(got)
		if want := []string{o.dev + "-0", o.dev + "-1", o.dev + "-2"}; !slices.Equal(got, want) {
			t.Fatalf("%s got %v, want %v", o.dev, got, want)
		}
	}

	after := testsvc.Scrape(t, metrics)
	delta := func(s string) float64 { return after[s] - before[s] }
	// Alone: the two that held the turns, the one to the gone edge (nobody
	// else waited for that edge), and the ghosts' again after their groups.
	// One group per edge.
	if a, g, n := delta(aloneRequests), delta(groupRequests), delta(groupedTotal); a != float64(3+2*len(ghosts)) || g != 2 || n != float64(grouped) {
		t.Fatalf("requests alone %v, in groups %v carrying %v; want %d, 2 carrying %d (for %d deliveries)", a, g, n, 3+2*len(ghosts), grouped, len(calls)+len(lead))
	}
}

// TestDeliverSequentialCallersInOrder: a caller that waits for each
// answer before it sends the next delivery to a device sees them reach the
// phone in its order, while other callers' deliveries to the same edges
// go by groups around them; alone on a quiet gateway, each delivery is one
// request of its own, and none waits for another.
func TestDeliverSequentialCallersInOrder(t *testing.T) {
	e, metrics := startGroups(t)
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for k, node := range e.nodes {
		for i := range 3 {
			dev := device(fmt.Sprintf("busy%d-%d", k, i))
			phone := phoneOn(t, node, dev, client.Options{Timeout: 5 * time.Second, AutoAck: true})
			wg.Go(func() { // the phone reads what it gets
				for {
					if _, err := phone.Next(ctx); err != nil {
						return
					}
				}
			})
			wg.Go(func() { // a caller that does not wait for the others
				for n := 0; ctx.Err() == nil; n++ {
					r := <-postAsync(t, e, map[string]any{"target": dev, "text": fmt.Sprintf("busy %d", n)})
					if r.status != http.StatusOK && ctx.Err() == nil {
						t.Errorf("a busy caller's delivery: %d %s", r.status, r.body)
						return
					}
				}
			})
		}
	}
	var phones []*client.Conn
	var devs []string
	for k, node := range e.nodes {
		dev := device(fmt.Sprintf("seq%d", k))
		devs = append(devs, dev)
		phones = append(phones, phoneOn(t, node, dev, client.Options{Timeout: 5 * time.Second, AutoAck: true}))
	}
	const n = 40
	for i := range n {
		for k, dev := range devs {
			wantOK(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "id": fmt.Sprintf("%d-%d", k, i), "text": "n"}))
		}
	}
	stop()
	wg.Wait()
	for k, phone := range phones {
		got := messageIDs(t, phone, n)
		for i, id := range got {
			if want := fmt.Sprintf("%d-%d", k, i); id != want {
				t.Fatalf("device %d got %v: %s where %s was next", k, got, id, want)
			}
		}
	}

	// Quiet now: one request alone per delivery.
	before := testsvc.Scrape(t, metrics)
	for i := range 10 {
		for k, dev := range devs {
			wantOK(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "id": fmt.Sprintf("q%d-%d", k, i), "text": "n"}))
		}
	}
	after := testsvc.Scrape(t, metrics)
	if a, g := after[aloneRequests]-before[aloneRequests], after[groupRequests]-before[groupRequests]; a != 20 || g != 0 {
		t.Fatalf("20 deliveries one after another: %v requests alone, %v groups; want 20, 0", a, g)
	}
}

// TestTraceDeliverInGroup: a POST /v1/deliver whose output goes in its
// edge's group has the spans it has alone: its server span in the caller's
// trace, its router.deliver, and the edge's edge.deliver the child of that
// (the output names it in the group's message).
func TestTraceDeliverInGroup(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprintf("cluster=%v", cluster), func(t *testing.T) {
			e := startTracedWith(t, cluster, 10*time.Second)
			e.api.Groups().SetHold(time.Minute) // a turn ends with its request's answer
			holder, dev := device("holder"), device("tel")
			holderPhone, phone := e.phone(t, holder), e.phone(t, dev)
			lead := postAsync(t, e.env, map[string]any{"target": holder, "id": "lead", "text": "first", "wait": "ack"})
			messageIDs(t, holderPhone, 1)
			callers := make([]callerTrace, 3)
			var res []<-chan response
			for i := range callers {
				callers[i] = newCallerTrace(t)
				res = append(res, postAsyncWith(t, e.env, map[string]any{"target": dev, "text": "grouped"},
					http.Header{"Traceparent": {callers[i].traceparent}}))
			}
			waitFor(t, "3 deliveries waiting for the edge's turn", func() bool { return e.api.Groups().Waiting() == len(callers) })
			if err := holderPhone.Ack("lead"); err != nil {
				t.Fatal(err)
			}
			for _, r := range append(res, lead) {
				wantOK(t, <-r)
			}
			messageIDs(t, phone, len(callers))
			for _, c := range callers {
				e.waitSpans(t, c.trace, "POST /v1/deliver server span with router.deliver and edge.deliver", func(spans []sdktrace.ReadOnlySpan) bool {
					srv := serverSpan(spans, c.span, "POST /v1/deliver")
					return srv != nil && deliveredUnder(spans, srv.SpanContext().SpanID(), "message")
				})
			}
		})
	}
}
