package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/tokens"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Bounds of GET /v1/events.
const (
	// eventsPage is how many entries a stream reads at once, and the
	// default max of a JSON read.
	eventsPage = 100
	// maxEventsPage bounds the max of a JSON read.
	maxEventsPage = 1000
	// maxEventsWait bounds the wait of a JSON read (a long poll).
	maxEventsWait = 30 * time.Second
	// pollEvery is how often a read that finds every waiting slot taken
	// looks at the log again.
	pollEvery = time.Second
	// waitStep is the longest one wait in the store.
	waitStep = time.Second
	// eventsChunk is how many entries one read takes from the store at
	// most; fewer as eventsReadBytes nears.
	eventsChunk = 16
	// eventsReadBytes bounds what one read answers, counted as written
	// (entrySize): the entries are JSON, escapes included, so a text of
	// 12,000 control characters takes 72,000 bytes. A read stops before
	// the entry that would pass it (but answers one entry, whatever its
	// size) and the client asks again from its cursor. While reading, a
	// read also holds the rest of one chunk: at most 16 entries of at most
	// about 150 KiB, under 3 MiB.
	eventsReadBytes = 256 << 10
	// eventFraming is the most an entry adds to an answer besides its
	// cursor and JSON: an event of a stream (id:, event: with a name of at
	// most 64 bytes, data:) or an item of a JSON answer
	// ({"cursor":…,"event":…},).
	eventFraming = 96
	// streamFlushBytes is how much of a stream is buffered before it is
	// written: a stream holds its read and at most this (and an entry).
	streamFlushBytes = 64 << 10
)

// codeTooManyReads answers an event read past APIConfig.MaxStreams.
const codeTooManyReads protocol.Code = "too_many_streams"

// eventItem is one entry of the JSON answer of GET /v1/events.
type eventItem struct {
	Cursor string          `json:"cursor"`
	Event  json.RawMessage `json:"event"`
}

type eventsBody struct {
	Events []eventItem `json:"events"`
	Cursor string      `json:"cursor"` // the last entry's, or the one asked after
}

// events is GET /v1/events: the event log after ?cursor= (or the
// Last-Event-ID header, which a reconnecting EventSource sends), as a
// Server-Sent Events stream, or as one JSON answer when the query has wait
// or max, or format=json, or the client accepts JSON and not event streams.
func (a *API) events(w http.ResponseWriter, req *http.Request) error {
	var lease *readLease // a file owner's read, counted in the store
	if owner := ownerOf(req); owner == tenant.Legacy {
		token, _ := bearer(req.Header.Get("Authorization")) // authorized
		release, ok := a.openRead(tokens.Sum(token))
		if !ok {
			w.Header().Set("Retry-After", "1")
			return apiErr(http.StatusTooManyRequests, codeTooManyReads,
				fmt.Sprintf("this token has %d event reads open, the most allowed; close one first", a.cfg.MaxStreams))
		}
		defer release()
	} else {
		var limit int
		var err error
		if lease, limit, err = a.openOwnerRead(req.Context(), owner); err != nil {
			return err
		}
		if lease == nil {
			a.r.tel.process.QuotaRefused(telemetry.QuotaEventReads)
			a.cfg.Usage.Refused(owner, tenant.QuotaEventReads, 1)
			w.Header().Set("Retry-After", "1")
			return apiErr(http.StatusTooManyRequests, codeTooManyReads,
				fmt.Sprintf("owner %s has %d event reads open across the gateway, its event_reads quota; close one first", owner, limit))
		}
		defer lease.release()
	}
	q := req.URL.Query()
	cursor := q.Get("cursor")
	if id := strings.TrimSpace(req.Header.Get("Last-Event-ID")); id != "" {
		cursor = id
	}
	if wantsJSON(req) || req.Method == http.MethodHead { // HEAD: never an endless stream
		return a.eventsJSON(w, req, cursor) // within maxEventsWait: no renewal
	}
	return a.eventsStream(w, req, cursor, lease)
}

func wantsJSON(req *http.Request) bool {
	q := req.URL.Query()
	switch {
	case q.Get("format") == "json" || q.Has("wait") || q.Has("max"):
		return true
	case q.Get("format") == "sse":
		return false
	}
	accept := req.Header.Get("Accept")
	return strings.Contains(accept, "application/json") && !strings.Contains(accept, "text/event-stream")
}

// eventsJSON answers one read: up to max entries (100; 1…1000), waiting up
// to wait seconds (0; at most 30) when there are none.
func (a *API) eventsJSON(w http.ResponseWriter, req *http.Request, cursor string) error {
	q := req.URL.Query()
	max := eventsPage
	if s := q.Get("max"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxEventsPage {
			return badFrame("max must be a whole number from 1 to %d", maxEventsPage)
		}
		max = n
	}
	var wait time.Duration
	if s := q.Get("wait"); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || f < 0 || f > maxEventsWait.Seconds() {
			return badFrame("wait must be a number of seconds from 0 to %v", maxEventsWait.Seconds())
		}
		wait = time.Duration(f * float64(time.Second))
	}
	ctx, stop := a.streamContext(req)
	defer stop()
	es, reached, err := a.readBounded(ctx, ownerOf(req), cursor, max, wait)
	if err != nil && ctx.Err() != nil && req.Context().Err() == nil {
		es, reached, err = nil, cursor, nil // the API is closing: answer what there is
	}
	if err != nil {
		return err
	}
	// Past the other owners' entries it skipped, too.
	body := eventsBody{Events: make([]eventItem, 0, len(es)), Cursor: reached}
	for _, e := range es {
		if !json.Valid(e.Data) {
			a.log.Warn("skipping an event log entry that is not JSON", "cursor", e.Cursor)
			continue
		}
		body.Events = append(body.Events, eventItem{Cursor: e.Cursor, Event: e.Data})
	}
	admin.WriteJSON(w, http.StatusOK, body)
	return nil
}

// eventsStream streams the log as Server-Sent Events until the client goes
// away, the API closes or the log cannot be read (the client reconnects
// with Last-Event-ID). An event is
//
//	id: <cursor>
//	event: <kind>
//	data: <wire.Event JSON>
//
// and a stream silent for KeepAlive gets a ": keepalive" comment.
//
// lease, when set, is the read's place in its owner's quota: the stream
// renews it as it writes (at least every keep-alive).
func (a *API) eventsStream(w http.ResponseWriter, req *http.Request, cursor string, lease *readLease) error {
	ctx, stop := a.streamContext(req)
	defer stop()
	// The first read checks the cursor while an error can still be answered.
	owner := ownerOf(req)
	es, reached, err := a.readBounded(ctx, owner, cursor, eventsPage, 0)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var buf bytes.Buffer
	buf.WriteString("retry: 2000\n\n") // reconnect after 2 s
	for {
		for _, e := range es {
			if !appendSSE(&buf, e) {
				a.log.Warn("skipping an event log entry that is not JSON", "cursor", e.Cursor)
			}
			if buf.Len() >= streamFlushBytes {
				if err := a.flush(w, rc, &buf); err != nil {
					a.log.Debug("event stream ended", "err", err)
					return nil
				}
			}
		}
		cursor = reached
		lease.renew(ctx)
		if buf.Len() == 0 {
			buf.WriteString(": keepalive\n\n")
		}
		if err := a.flush(w, rc, &buf); err != nil {
			a.log.Debug("event stream ended", "err", err)
			return nil
		}
		if k := keyOf(req); k != nil && !a.cfg.Tenants.Snapshot().Has(k) {
			a.log.Info("event stream ended: its key was withdrawn")
			return nil // the client's reconnection is refused
		}
		if es, reached, err = a.readBounded(ctx, owner, cursor, eventsPage, a.cfg.KeepAlive); err != nil {
			if ctx.Err() == nil {
				a.log.Warn("event stream: reading the log failed; ending the stream", "err", err)
			}
			return nil
		}
	}
}

// appendSSE writes e as an event, or reports false for an entry that is
// not JSON.
func appendSSE(buf *bytes.Buffer, e store.EventEntry) bool {
	var head struct {
		Kind string `json:"kind"`
	}
	if wire.Unmarshal(e.Data, &head) != nil {
		return false
	}
	buf.WriteString("id: ")
	buf.WriteString(e.Cursor)
	if eventName(head.Kind) {
		buf.WriteString("\nevent: ")
		buf.WriteString(head.Kind)
	}
	buf.WriteString("\ndata: ")
	_ = json.Compact(buf, e.Data) // one line; valid, as Unmarshal said
	buf.WriteString("\n\n")
	return true
}

// eventName reports whether kind can be an SSE event name as it is.
func eventName(kind string) bool {
	if kind == "" || len(kind) > 64 {
		return false
	}
	for _, c := range []byte(kind) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// flush writes buf to the stream within WriteTimeout and empties it.
func (a *API) flush(w http.ResponseWriter, rc *http.ResponseController, buf *bytes.Buffer) error {
	if err := rc.SetWriteDeadline(time.Now().Add(a.cfg.WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	_, err := w.Write(buf.Bytes())
	buf.Reset()
	if err != nil {
		return err
	}
	return rc.Flush()
}

// streamContext is req's context, ended by Close (and the router's) too.
func (a *API) streamContext(req *http.Request) (context.Context, func()) {
	ctx, cancel := context.WithCancel(req.Context())
	stop := context.AfterFunc(a.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// openRead counts an event read of the token whose digest is d, if it
// has fewer than MaxStreams open; release ends it.
func (a *API) openRead(d tokens.Digest) (release func(), ok bool) {
	a.streamsMu.Lock()
	defer a.streamsMu.Unlock()
	if a.streams[d] >= a.cfg.MaxStreams {
		return nil, false
	}
	a.streams[d]++
	return func() {
		a.streamsMu.Lock()
		defer a.streamsMu.Unlock()
		if a.streams[d]--; a.streams[d] == 0 {
			delete(a.streams, d)
		}
	}, true
}

// readLeaseTTL is how long a file owner's event read holds its place in
// the owner's event_reads quota (a lease in the store) without a renewal:
// longer than a long poll (maxEventsWait, 30 s, which does not renew), and
// than a stream's keep-alive (15 s) and write (10 s) between renewals. A
// router that dies with reads open leaves them counted this long at most.
const readLeaseTTL = time.Minute

// readRenewEvery is how long after its last renewal (by the router's
// clock) a stream renews its read's lease, at its next write or
// keep-alive.
const readRenewEvery = readLeaseTTL / 4

// readLease is a file owner's event read counted in the store.
type readLease struct {
	a     *API
	key   string
	id    string
	mu    sync.Mutex
	since time.Time // of the last renewal
}

// openOwnerRead takes a place in owner's event_reads quota, counted in
// the store across every router: nil (and the quota's limit) when the
// owner has as many reads open as its quota allows.
func (a *API) openOwnerRead(ctx context.Context, owner string) (*readLease, int, error) {
	limit := a.cfg.Tenants.Snapshot().QuotaOf(owner).EventReads
	l := &readLease{a: a, key: tenant.QuotaKey(owner, tenant.QuotaEventReads),
		id: a.leaseIDs + strconv.FormatUint(a.leaseSeq.Add(1), 10), since: a.r.cfg.Clock.Now()}
	ok, _, err := a.r.store.AcquireLease(ctx, l.key, l.id, limit, readLeaseTTL)
	if err != nil || !ok {
		return nil, limit, err
	}
	return l, limit, nil
}

// renew renews l if readRenewEvery has passed since the last renewal; a
// failure is logged (the lease lives on until its ttl, and the next
// renewal takes it again). A nil l does nothing.
func (l *readLease) renew(ctx context.Context) {
	if l == nil {
		return
	}
	now := l.a.r.cfg.Clock.Now()
	l.mu.Lock()
	due := now.Sub(l.since) >= readRenewEvery
	if due {
		l.since = now
	}
	l.mu.Unlock()
	if !due {
		return
	}
	if err := l.a.r.store.RenewLeases(ctx, l.key, []string{l.id}, readLeaseTTL); err != nil && ctx.Err() == nil {
		l.a.log.Warn("event stream: renewing its place in the owner's quota failed", "err", err)
	}
}

// release gives l's place back, also when the request's context ended.
func (l *readLease) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.a.r.store.ReleaseLease(ctx, l.key, l.id); err != nil {
		l.a.log.Warn("event read: releasing its place in the owner's quota failed; it lapses within a minute", "err", err)
	}
}

// readBounded returns up to most entries of owner after cursor, waiting
// up to wait for the first, that take at most eventsReadBytes as written
// (one entry whatever its size), and the cursor it read to: the last
// entry's, or past the other owners' entries it skipped. It reads
// eventsChunk entries at a time, fewer as the bound nears, and leaves an
// entry that would pass it to the next read.
func (a *API) readBounded(ctx context.Context, owner, after string, most int, wait time.Duration) ([]store.EventEntry, string, error) {
	var out []store.EventEntry
	size, largest := 0, 0
	deadline := time.Now().Add(wait)
	for len(out) < most && size < eventsReadBytes {
		n := min(most-len(out), eventsChunk)
		if largest > 0 {
			n = min(n, max(1, (eventsReadBytes-size)/largest))
		}
		es, reached, full, err := a.read(ctx, owner, after, n, wait)
		if err != nil {
			if len(out) > 0 {
				return out, after, nil // the next read reports it
			}
			return nil, after, err
		}
		for _, e := range es {
			s := entrySize(e)
			if len(out) > 0 && size+s > eventsReadBytes {
				return out, after, nil
			}
			size, largest = size+s, max(largest, s)
			after = e.Cursor
			out = append(out, e)
		}
		after = reached // every entry of es was taken: past the others' too
		if !full {
			break
		}
		if len(out) > 0 {
			wait = 0
		} else {
			wait = max(0, time.Until(deadline)) // others' entries only, so far
		}
	}
	return out, after, nil
}

// ownEntry is e as owner's agent sees it: with its device's own id
// (tenant.DeviceID), never the device key. Each owner's events have a log
// of their own; an entry of another owner's device, which no owner's log
// should hold, is false all the same. An entry that is not an event stays
// as it is, for the legacy owner only.
func ownEntry(owner string, e store.EventEntry) (store.EventEntry, bool) {
	if !tenant.MayHoldOwnerKey(e.Data) {
		return e, owner == tenant.Legacy // a legacy device's: not decoded here
	}
	var ev wire.Event
	if wire.Unmarshal(e.Data, &ev) != nil {
		return e, owner == tenant.Legacy
	}
	if tenant.OwnerOf(ev.Device) != owner {
		return e, false
	}
	if owner == tenant.Legacy {
		return e, true // as it is: its device ids are its keys
	}
	ev.Device = tenant.DeviceID(ev.Device)
	ev.Session = protocol.Session(ev.Device)
	data, err := wire.Marshal(ev)
	if err != nil {
		return e, false
	}
	return store.EventEntry{Cursor: e.Cursor, Data: data}, true
}

// entrySize is the most e takes written in an answer: its cursor, its
// JSON as the log holds it (compact and escaped; the answers write it as
// it is) and the framing.
func entrySize(e store.EventEntry) int { return len(e.Cursor) + len(e.Data) + eventFraming }

// Readers is the number of event reads in progress: long polls and event
// streams waiting for an entry.
func (a *API) Readers() int { return int(a.readers.Load()) }

// read returns the entries after cursor, waiting up to wait for one. It
// waits in steps of waitStep: redisstore cannot interrupt a blocking read
// when ctx is canceled, so a stream whose client left, or a shutdown, is
// noticed within a step. At most MaxWaiting reads wait in the store at
// once; the others look again every pollEvery.
//
// Of what it reads it returns owner's entries only (ownEntry), the cursor
// it read to, and whether the last store read was full (more may follow);
// a read of only other owners' entries goes on after them.
func (a *API) read(ctx context.Context, owner, after string, most int, wait time.Duration) (own []store.EventEntry, reached string, full bool, err error) {
	reached = after
	deadline := time.Now().Add(wait)
	for {
		es, err := a.readLog(ctx, owner, reached, most, max(0, time.Until(deadline)))
		if err != nil {
			return nil, reached, false, err
		}
		full = len(es) == most
		for _, e := range es {
			if o, ok := ownEntry(owner, e); ok {
				own = append(own, o)
			}
			reached = e.Cursor
		}
		if len(own) > 0 || full || len(es) == 0 || time.Until(deadline) <= 0 || ctx.Err() != nil {
			return own, reached, full, nil
		}
		// Only other owners' entries, and no more for now: wait after
		// them for what is left of wait.
	}
}

// readLog returns the entries of owner's log after cursor, waiting up to
// wait for one.
func (a *API) readLog(ctx context.Context, owner, after string, max int, wait time.Duration) ([]store.EventEntry, error) {
	a.readers.Add(1)
	defer a.readers.Add(-1)
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return a.r.store.ReadEventsIn(ctx, owner, after, max, 0)
		}
		var es []store.EventEntry
		var err error
		select {
		case a.waiting <- struct{}{}:
			es, err = a.r.store.ReadEventsIn(ctx, owner, after, max, min(left, waitStep))
			<-a.waiting
		default:
			if es, err = a.r.store.ReadEventsIn(ctx, owner, after, max, 0); err == nil && len(es) == 0 {
				t := time.NewTimer(min(pollEvery, left))
				select {
				case <-t.C:
				case <-ctx.Done():
				}
				t.Stop()
			}
		}
		if err != nil || len(es) > 0 {
			return es, err
		}
	}
}

// blob is GET /v1/blobs/{key}: the bytes of a file in the store (an
// upload's media.blob), as ?mime= says or application/octet-stream.
// Range requests work, for audio and video players.
func (a *API) blob(w http.ResponseWriter, req *http.Request) error {
	key := req.PathValue("key")
	var data []byte
	err := store.ErrNotFound // another owner's blob is not found
	if store.BlobSpace(key) == ownerOf(req) {
		data, err = a.r.store.GetBlob(req.Context(), key)
	}
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, codeNotFound, "no such file; files are kept for a limited time")
	}
	if err != nil {
		return err
	}
	ct := "application/octet-stream"
	if m := req.URL.Query().Get("mime"); m != "" {
		if _, _, err := mime.ParseMediaType(m); err == nil {
			ct = m
		}
	}
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "private, no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox") // never a page of this origin
	http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(data))
	return nil
}
