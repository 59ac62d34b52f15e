package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// The event log is one Redis stream, P events, whose entries hold the event
// in the field "d"; the stream ids are the cursors. Each append trims the
// stream with MAXLEN ~ (whole stream nodes, so it may keep up to about a
// node, 100 entries by default, more than asked) and sets the key's TTL to
// EventTTL: a log nobody appends to for that long is deleted. Its cursors
// stay valid after that, because stream ids follow the Redis clock.
//
//	P events                              stream  field "d": the event; PX EventTTL from the last append

// EventTTL is how long the event log outlives its last append.
const EventTTL = 24 * time.Hour

// blockMargin is how much sooner than its context's deadline a blocking
// read is made to end: the socket deadline comes from the context
// (ContextTimeoutEnabled), and a read cut by it would be an error rather
// than the empty answer of a wait that ran out.
const blockMargin = 100 * time.Millisecond

// eventsKey is the stream of the event log called log: "events" for "",
// "events:<log>" for another (an owner's).
func (s *Store) eventsKey(log string) string {
	if log == "" {
		return s.prefix + "events"
	}
	return s.prefix + "events:" + log
}

// appendEventScript adds an entry, trims the stream and renews its TTL.
// KEYS: events. ARGV: data, maxLen, ttl ms. Reply: the entry's id.
var appendEventScript = redis.NewScript(`
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'd', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return id
`)

// AppendEvent adds data to the event log and returns its stream id.
func (s *Store) AppendEvent(ctx context.Context, data []byte, maxLen int) (string, error) {
	return s.AppendEventIn(ctx, "", data, maxLen)
}

// AppendEventIn is AppendEvent of the log called log.
func (s *Store) AppendEventIn(ctx context.Context, log string, data []byte, maxLen int) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", opErr("AppendEvent", err)
	}
	if maxLen < 1 {
		return "", opErr("AppendEvent", errors.New("maxLen must be positive"))
	}
	id, err := appendEventScript.Run(ctx, s.rdb, []string{s.eventsKey(log)}, data, maxLen, ms(EventTTL)).Text()
	if err != nil {
		return "", s.redisErr(ctx, "AppendEvent", err)
	}
	return id, nil
}

// ReadEvents reads the stream after the id after with XREAD, blocking up
// to wait (XREAD BLOCK) when there is nothing to read. When ctx has a
// deadline, the block ends blockMargin before it.
func (s *Store) ReadEvents(ctx context.Context, after string, max int, wait time.Duration) ([]store.EventEntry, error) {
	return s.ReadEventsIn(ctx, "", after, max, wait)
}

// ReadEventsIn is ReadEvents of the log called log.
func (s *Store) ReadEventsIn(ctx context.Context, log, after string, max int, wait time.Duration) ([]store.EventEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("ReadEvents", err)
	}
	if after == "" {
		after = "0-0"
	} else if !validStreamID(after) {
		// Checked here: XREAD also takes "$", "+" and ids without a sequence.
		return nil, fmt.Errorf("redisstore: ReadEvents: %w: %q", store.ErrBadCursor, after)
	}
	if max < 1 {
		max = 1
	}
	block := time.Duration(-1) // no BLOCK: XREAD BLOCK 0 would wait forever
	if wait > 0 {
		block = wait
		if dl, ok := ctx.Deadline(); ok {
			block = min(block, time.Until(dl)-blockMargin)
		}
		if block < time.Millisecond {
			block = -1
		} else {
			block = time.Duration(ms(block)) * time.Millisecond
		}
	}
	res, err := s.rdb.XRead(ctx, &redis.XReadArgs{
		Streams: []string{s.eventsKey(log), after},
		Count:   int64(max),
		Block:   block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		// Nothing came. A ctx that ended meanwhile says so, as memstore does.
		if cerr := ctx.Err(); cerr != nil {
			return nil, opErr("ReadEvents", cerr)
		}
		return nil, nil
	}
	if err != nil {
		if cerr := ctxEnded(ctx); cerr != nil && wait > 0 {
			// A wait the caller's context cut short (the socket deadline,
			// taken from ctx, may fire first) is the caller's ending, not
			// Redis failing: the context's error alone, as memstore gives.
			return nil, fmt.Errorf("redisstore: ReadEvents: %w (%v)", cerr, err)
		}
		return nil, s.redisErr(ctx, "ReadEvents", err)
	}
	var out []store.EventEntry
	for _, st := range res {
		for _, m := range st.Messages {
			d, _ := m.Values["d"].(string)
			out = append(out, store.EventEntry{Cursor: m.ID, Data: []byte(d)})
		}
	}
	return out, nil
}

// validStreamID reports whether id is "<ms>-<seq>", two unsigned 64-bit
// decimal numbers.
func validStreamID(id string) bool {
	a, b, ok := strings.Cut(id, "-")
	_, err1 := strconv.ParseUint(a, 10, 64)
	_, err2 := strconv.ParseUint(b, 10, 64)
	return ok && err1 == nil && err2 == nil
}
