package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// errBadMaxLen rejects a log that could keep nothing.
var errBadMaxLen = errors.New("memstore: maxLen must be positive")

// eventID is a cursor: the append time in unix milliseconds and a sequence
// number within that millisecond, as in a Redis stream id.
type eventID struct{ ms, seq uint64 }

func (id eventID) String() string {
	return strconv.FormatUint(id.ms, 10) + "-" + strconv.FormatUint(id.seq, 10)
}

func (id eventID) after(o eventID) bool {
	return id.ms > o.ms || id.ms == o.ms && id.seq > o.seq
}

// parseEventID reads a cursor "<ms>-<seq>".
func parseEventID(s string) (eventID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return eventID{}, fmt.Errorf("%w: %q", store.ErrBadCursor, s)
	}
	return eventID{a, b}, nil
}

// eventItem is one entry of the log.
type eventItem struct {
	id   eventID
	data []byte
}

// eventLog is the Store's event log: a slice trimmed at its head to the
// maxLen of the last append, so it holds at most that many entries (the
// backing array is reallocated as it fills, so it stays within a small
// multiple of maxLen). The zero value is an empty log.
type eventLog struct {
	mu    sync.Mutex
	items []eventItem // oldest first, ids increasing
	last  eventID     // the last id handed out
	// wake is closed by the next append, for the readers waiting on it;
	// nil while nobody waits.
	wake chan struct{}
}

// AppendEvent adds data to the log and returns its cursor. The log keeps
// exactly the newest maxLen entries.
func (s *Store) AppendEvent(ctx context.Context, data []byte, maxLen int) (string, error) {
	return s.AppendEventIn(ctx, "", data, maxLen)
}

// eventLogs are the logs other than "" (owners'), made on first use.
type eventLogs struct {
	mu   sync.Mutex
	byID map[string]*eventLog
}

// eventLog is the log called name.
func (s *Store) eventLog(name string) *eventLog {
	if name == "" {
		return &s.events
	}
	s.otherEvents.mu.Lock()
	defer s.otherEvents.mu.Unlock()
	l := s.otherEvents.byID[name]
	if l == nil {
		if s.otherEvents.byID == nil {
			s.otherEvents.byID = make(map[string]*eventLog)
		}
		l = &eventLog{}
		s.otherEvents.byID[name] = l
	}
	return l
}

// AppendEventIn is AppendEvent of the log called log.
func (s *Store) AppendEventIn(ctx context.Context, log string, data []byte, maxLen int) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if maxLen < 1 {
		return "", errBadMaxLen
	}
	data = bytes.Clone(data)
	l := s.eventLog(log)
	l.mu.Lock()
	defer l.mu.Unlock()
	id := eventID{ms: uint64(s.clock.Now().UnixMilli())}
	if !id.after(l.last) {
		// The clock did not move on (or went back): count within the last ms.
		id = eventID{l.last.ms, l.last.seq + 1}
	}
	l.last = id
	l.items = append(l.items, eventItem{id, data})
	if n := len(l.items) - maxLen; n > 0 {
		clear(l.items[:n]) // let the dropped bytes be collected
		l.items = l.items[n:]
	}
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
	return id.String(), nil
}

// ReadEvents returns up to max entries after the cursor after, waiting up
// to wait for one when there are none. A ctx that ends while it waits
// returns ctx's error.
func (s *Store) ReadEvents(ctx context.Context, after string, max int, wait time.Duration) ([]store.EventEntry, error) {
	return s.ReadEventsIn(ctx, "", after, max, wait)
}

// ReadEventsIn is ReadEvents of the log called log.
func (s *Store) ReadEventsIn(ctx context.Context, log, after string, max int, wait time.Duration) ([]store.EventEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var from eventID
	if after != "" {
		var err error
		if from, err = parseEventID(after); err != nil {
			return nil, err
		}
	}
	if max < 1 {
		max = 1
	}
	var timeout <-chan time.Time
	l := s.eventLog(log)
	for {
		l.mu.Lock()
		i := sort.Search(len(l.items), func(i int) bool { return l.items[i].id.after(from) })
		if n := min(len(l.items)-i, max); n > 0 {
			out := make([]store.EventEntry, n)
			for j, it := range l.items[i : i+n] {
				out[j] = store.EventEntry{Cursor: it.id.String(), Data: bytes.Clone(it.data)}
			}
			l.mu.Unlock()
			return out, nil
		}
		if wait <= 0 {
			l.mu.Unlock()
			return nil, nil
		}
		if l.wake == nil {
			l.wake = make(chan struct{})
		}
		wake := l.wake
		l.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-wake:
		case <-timeout:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
