package router_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestEventsJSON reads the log in pages: resuming with a cursor gives only
// the later events, nothing lost or repeated, and a resent message (the
// same id) is not an event again.
func TestEventsJSON(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		if got, cursor := e.readEvents(t, "wait=0"); len(got) != 0 || cursor != "" {
			t.Fatalf("a new log: %+v, cursor %q", got, cursor)
		}
		// A long poll returns as soon as an event comes.
		type result struct {
			evs  []loggedEvent
			took time.Duration
		}
		polled := make(chan result, 1)
		go func() {
			start := time.Now()
			evs, _ := e.readEvents(t, "wait=20")
			polled <- result{evs, time.Since(start)}
		}()
		waitReaders(t, e.api, 1)
		if err := phone.Text("m-0", "text 0"); err != nil {
			t.Fatal(err)
		}
		r := <-polled
		if len(r.evs) != 1 || r.evs[0].Event.Text != "text 0" || r.took > 10*time.Second {
			t.Fatalf("long poll: %+v after %v", r.evs, r.took)
		}
		cursor := r.evs[0].Cursor

		for i := 1; i <= 5; i++ {
			if err := phone.Text(fmt.Sprint("m-", i), fmt.Sprint("text ", i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := phone.Text("m-3", "text 3 again"); err != nil { // a resend
			t.Fatal(err)
		}
		if err := phone.Text("m-6", "text 6"); err != nil {
			t.Fatal(err)
		}
		all, _ := e.waitEvents(t, cursor, 6)

		// Pages of 2, each after the last cursor of the one before.
		var paged []string
		after := cursor
		for range 10 {
			evs, next := e.readEvents(t, "max=2&cursor="+after)
			if len(evs) > 2 {
				t.Fatalf("max=2 gave %d events", len(evs))
			}
			if len(evs) == 0 {
				if next != after {
					t.Fatalf("an empty read answered cursor %q, want the one asked after, %q", next, after)
				}
				break
			}
			if next != evs[len(evs)-1].Cursor {
				t.Fatalf("cursor %q, want the last event's %q", next, evs[len(evs)-1].Cursor)
			}
			for _, ev := range evs {
				paged = append(paged, ev.Event.ID+":"+ev.Event.Text)
			}
			after = next
		}
		want := []string{"m-1:text 1", "m-2:text 2", "m-3:text 3", "m-4:text 4", "m-5:text 5", "m-6:text 6"}
		if fmt.Sprint(paged) != fmt.Sprint(want) {
			t.Fatalf("paged events %q, want %q", paged, want)
		}
		for i, ev := range all {
			if ev.Event.ID+":"+ev.Event.Text != want[i] {
				t.Fatalf("event %d %+v, want %s", i, ev.Event, want[i])
			}
		}
		// From the start: every event.
		if evs, _ := e.readEvents(t, "max=1000"); len(evs) != 7 {
			t.Fatalf("from the oldest: %d events, want 7", len(evs))
		}
		// Accept: application/json asks for JSON too.
		r2 := callURL(t, e.url, "GET", "/v1/events?cursor="+cursor, agentToken, nil, http.Header{"Accept": {"application/json"}})
		if r2.status != 200 || r2.header.Get("Content-Type") != "application/json" {
			t.Fatalf("Accept: application/json: %d %s", r2.status, r2.header.Get("Content-Type"))
		}
	})
}

// TestEventsStream reads the log as Server-Sent Events, and resumes it
// with Last-Event-ID and with ?cursor.
func TestEventsStream(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		dev := device("tel")
		phone := e.phone(t, dev)
		send := func(id string) {
			t.Helper()
			if err := phone.Text(id, "say "+id); err != nil {
				t.Fatal(err)
			}
		}
		next := func(s *sseStream, id string) string {
			t.Helper()
			raw, ev := s.next(t)
			if raw.event != wire.EventText || ev.ID != id || ev.Text != "say "+id || ev.Device != dev || raw.id == "" {
				t.Fatalf("stream event %+v (%+v), want text %s", raw, ev, id)
			}
			return raw.id
		}

		s := e.openStream(t, "", nil)
		send("s-1")
		next(s, "s-1")
		send("s-2")
		c2 := next(s, "s-2")
		// Idle: keep-alive comments (every 300 ms here).
		select {
		case c := <-s.comments:
			if c != "keepalive" {
				t.Fatalf("comment %q, want keepalive", c)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no keepalive on an idle stream")
		}
		s.resp.Body.Close()

		// Missed while away, then read on reconnection: only those.
		send("s-3")
		send("s-4")
		e.waitEvents(t, c2, 2) // they are in the log
		s = e.openStream(t, "cursor=nonsense-ignored", http.Header{"Last-Event-ID": {c2}})
		c3 := next(s, "s-3")
		next(s, "s-4")
		send("s-5")
		next(s, "s-5")
		s.none(t, 500*time.Millisecond)

		s = e.openStream(t, "cursor="+c3, nil)
		next(s, "s-4")
		next(s, "s-5")
		s.none(t, 500*time.Millisecond)

		// From the start.
		s = e.openStream(t, "", nil)
		for i := 1; i <= 5; i++ {
			next(s, fmt.Sprint("s-", i))
		}
	})
}

func TestEventsRejects(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		for _, q := range []string{"cursor=nonsense", "cursor=1-2-3&wait=0", "max=0", "max=1001", "max=x", "wait=31", "wait=-1", "wait=NaN", "wait=soon"} {
			wantError(t, e.call(t, "GET", "/v1/events?"+q, agentToken, nil), http.StatusBadRequest, "bad_frame")
		}
		// A stream with a bad cursor is refused before it starts.
		r := callURL(t, e.url, "GET", "/v1/events?cursor=$", agentToken, nil, http.Header{"Accept": {"text/event-stream"}})
		wantError(t, r, http.StatusBadRequest, "bad_frame")
		r = callURL(t, e.url, "GET", "/v1/events", agentToken, nil, http.Header{"Last-Event-ID": {"x"}})
		wantError(t, r, http.StatusBadRequest, "bad_frame")
	})
}

// TestEventsStreamEndsOnClose: closing the API ends its streams and long
// polls, so a server shutdown does not wait for them.
func TestEventsStreamEndsOnClose(t *testing.T) {
	eachEnv(t, func(c *router.APIConfig) { c.KeepAlive = time.Minute }, func(t *testing.T, e *env) {
		s := e.openStream(t, "", nil)
		polled := make(chan response, 1)
		go func() { polled <- e.call(t, "GET", "/v1/events?wait=30", agentToken, nil) }()
		waitReaders(t, e.api, 2) // the stream and the long poll
		start := time.Now()
		e.api.Close()
		select {
		case _, ok := <-s.events:
			if ok {
				t.Fatal("an event on a closing stream")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the stream did not end within 5 s of Close")
		}
		select {
		case r := <-polled:
			if r.status != http.StatusOK || string(r.body) != "{\"events\":[],\"cursor\":\"\"}\n" {
				t.Fatalf("long poll at Close: %d %s", r.status, r.body)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the long poll did not end within 5 s of Close")
		}
		if d := time.Since(start); d > testsvc.Slack(3*time.Second) {
			t.Fatalf("Close took %v to end the readers", d)
		}
	})
}

// TestEventsManyReaders: more readers than MaxWaiting all get the event.
func TestEventsManyReaders(t *testing.T) {
	e := startSingle(t, apiConfig(func(c *router.APIConfig) { c.MaxWaiting = 2 }))
	phone := e.phone(t, device("tel"))
	const readers = 6
	got := make(chan []loggedEvent, readers)
	for range readers {
		go func() {
			evs, _ := e.readEvents(t, "wait=20")
			got <- evs
		}()
	}
	waitReaders(t, e.api, readers)
	if err := phone.Text("m-1", "for everyone"); err != nil {
		t.Fatal(err)
	}
	for range readers {
		select {
		case evs := <-got:
			if len(evs) != 1 || evs[0].Event.Text != "for everyone" {
				t.Fatalf("a reader got %+v", evs)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a reader did not get the event within 10 s")
		}
	}
}

// waitReaders waits until api has n event reads in progress.
func waitReaders(t *testing.T, api *router.API, n int) {
	t.Helper()
	testsvc.WaitFor(t, 10*time.Second, fmt.Sprintf("%d event reads in progress", n), func() bool { return api.Readers() >= n })
}
