package router_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// slowStream opens GET /v1/events as an event stream on a socket with a
// 4 KiB receive buffer that reads nothing past the answer's head, and
// returns the socket and the answer.
func slowStream(t *testing.T, base string) (net.Conn, *http.Response) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		rc.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
		return err
	}}
	host := strings.TrimPrefix(base, "http://")
	nc, err := d.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	fmt.Fprintf(nc, "GET /v1/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n", host, agentToken)
	nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("GET /v1/events: %v", err)
	}
	return nc, resp
}

// TestEventsSlowStreamsBounded: 60 event streams of one token that stop
// reading a log of 7 MiB (600 texts of 12,000 characters). 8 (MaxStreams)
// are served and the 9th on get 429 too_many_streams; each served one holds
// at most a bounded read and 64 KiB, so the router's heap grows by less
// than 24 MiB. Unbounded, each held a page of 100 entries twice (about
// 2.4 MiB here: 300 such streams took a router to 4 GiB). A phone and the
// agent still round-trip, and once a stream closes another is served.
func TestEventsSlowStreamsBounded(t *testing.T) {
	const streams, entries = 60, 600
	e := startSingle(t, apiConfig(func(c *router.APIConfig) { c.WriteTimeout = time.Minute }))
	text := strings.Repeat("x", 12000)
	for i := range entries {
		data, _ := json.Marshal(map[string]any{"kind": "text", "session": "mobile:log", "device": "log", "id": fmt.Sprint("m-", i), "text": text})
		if _, err := e.store.AppendEvent(t.Context(), data, 10000); err != nil {
			t.Fatal(err)
		}
	}
	before := testsvc.LiveHeap(t)
	var open []net.Conn
	statuses := map[int]int{}
	for i := range streams {
		nc, resp := slowStream(t, e.url)
		statuses[resp.StatusCode]++
		switch resp.StatusCode {
		case http.StatusOK:
			open = append(open, nc)
		case http.StatusTooManyRequests:
			body, _ := io.ReadAll(resp.Body)
			var m map[string]any
			if json.Unmarshal(body, &m) != nil || m["error"] != "too_many_streams" || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("stream %d: 429 %s %s; want a JSON too_many_streams", i, resp.Header.Get("Content-Type"), body)
			}
			nc.Close()
		default:
			t.Fatalf("stream %d: status %d", i, resp.StatusCode)
		}
	}
	if statuses[http.StatusOK] != 8 || statuses[http.StatusTooManyRequests] != streams-8 {
		t.Fatalf("statuses %v; want 8 × 200 and %d × 429", statuses, streams-8)
	}
	// Every stream served is stuck writing: none reads the log.
	testsvc.WaitFor(t, 20*time.Second, "the streams to stop reading the log", func() bool { return e.api.Readers() == 0 })
	held := testsvc.LiveHeap(t) - before
	t.Logf("%d slow streams: the heap grew %d KiB", len(open), held>>10)
	if held > 24<<20 {
		t.Fatalf("%d slow streams hold %d KiB; want under 24 MiB", len(open), held>>10)
	}

	dev := device("tel")
	phone := e.phone(t, dev)
	if err := phone.Text("m-1", "hello"); err != nil {
		t.Fatal(err)
	}
	wantOK(t, e.call(t, "POST", "/v1/sessions/mobile:"+dev+"/messages", agentToken, map[string]any{"id": "a-1", "text": "answer"}))
	if f := expect(t, phone, "message"); !strings.Contains(f.String(), "answer") {
		t.Fatalf("the phone got %s", f)
	}
	wantError(t, e.call(t, "GET", "/v1/events?wait=0", agentToken, nil), http.StatusTooManyRequests, "too_many_streams")

	open[0].Close()
	testsvc.WaitFor(t, 20*time.Second, "a stream served once one closed", func() bool {
		nc, resp := slowStream(t, e.url)
		defer nc.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// TestEventsReadBoundedBySize: a JSON read answers at most 256 KiB of
// the log as written, escapes included, and stops at the entry that would
// pass it. The log holds 40 texts of 12,000 characters that JSON escapes
// (quotes, backslashes, control characters), 33 KB each as written, and
// one larger than the bound. A read of max=100 answers the 7 entries that
// fit (231 KB); the 8th would pass 256 KiB. (Before, the bound was looked
// at only between reads of 16 entries from the store: 16 entries, 530 KB.)
// Reading on from each answer's cursor gives every entry once, in order;
// the large one comes alone.
func TestEventsReadBoundedBySize(t *testing.T) {
	const entries, bound = 40, 256 << 10
	e := startSingle(t, apiConfig(nil))
	text := strings.Repeat("\"\\\x01<", 3000) // 12,000 characters; JSON writes 33,000 bytes
	large := strings.Repeat("\x1f", 60000)    // 360,000 bytes written
	for i := range entries + 1 {
		ev := wire.Event{Kind: wire.EventText, Session: "mobile:log", Device: "log", ID: fmt.Sprint("m-", i), Text: text}
		if i == entries {
			ev.Text = large
		}
		data, err := wire.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.AppendEvent(t.Context(), data, 10000); err != nil {
			t.Fatal(err)
		}
	}
	// read answers one JSON read after cursor: its entries as written, the
	// ids of their events, and its cursor.
	read := func(cursor string) (items []json.RawMessage, ids []string, next string) {
		r := e.call(t, "GET", "/v1/events?max=100&cursor="+cursor, agentToken, nil)
		var body struct {
			Events []json.RawMessage `json:"events"`
			Cursor string            `json:"cursor"`
		}
		if r.status != http.StatusOK || json.Unmarshal(r.body, &body) != nil {
			t.Fatalf("GET /v1/events: %d %.200s", r.status, r.body)
		}
		for _, item := range body.Events {
			var le loggedEvent
			if err := json.Unmarshal(item, &le); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, le.Event.ID)
		}
		return body.Events, ids, body.Cursor
	}
	written := func(items []json.RawMessage) (n int) {
		for _, item := range items {
			n += len(item) + 1 // and its comma
		}
		return n
	}

	first, _, cursor := read("")
	second, _, _ := read(cursor)
	size, next := written(first), written(second[:1])
	t.Logf("a read answered %d entries, %d bytes written; the next entry is %d bytes", len(first), size, next)
	if len(first) != 7 || size > bound || size+next <= bound {
		t.Fatalf("a read answered %d entries, %d bytes written, the next %d; want the 7 that fit in %d bytes", len(first), size, next, bound)
	}

	var got []string
	cursor = ""
	for len(got) < entries+1 {
		items, ids, c := read(cursor)
		if len(items) == 0 {
			t.Fatalf("a read after %d entries answered none", len(got))
		}
		if size := written(items); size > bound && len(items) > 1 {
			t.Fatalf("a read answered %d entries, %d bytes written, past %d", len(items), size, bound)
		}
		if slices.Contains(ids, fmt.Sprint("m-", entries)) && len(ids) != 1 {
			t.Fatalf("the entry larger than the bound came with %d others", len(ids)-1)
		}
		got, cursor = append(got, ids...), c
	}
	for i, id := range got {
		if id != fmt.Sprint("m-", i) {
			t.Fatalf("entry %d is %s: %v", i, id, got)
		}
	}
}
