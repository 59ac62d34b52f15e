// Package bus is the contract for moving messages between edges and routers.
//
// natsbus implements it on NATS, against an external server or one embedded
// in the process; bustest is the conformance suite both run. Subjects are
// built by the functions in this package and documented in
// docs/architecture.md.
package bus

import (
	"context"
	"errors"
	"strings"
)

// ErrNoResponders: nobody listens on the subject (for a device subject: the
// device is offline).
var ErrNoResponders = errors.New("bus: no responders")

// ErrUnavailable: the bus cannot be reached; retry later.
var ErrUnavailable = errors.New("bus: unavailable")

// Msg is a received message. Respond answers a request; it is a no-op for a
// message that was published without a reply subject.
type Msg struct {
	Subject string
	Data    []byte
	Header  map[string]string
	Respond func(data []byte) error
	// Late: the message reached its subscription after Unsubscribe began
	// (the server routed it before it heard of the unsubscribe). It is
	// handled all the same, so that a request is answered rather than left
	// to time out.
	Late bool
}

// Handler handles one message. Handlers of one subscription run one at a
// time per subject, in arrival order; a handler must not block for long.
type Handler func(m *Msg)

// Subscription is an active interest. Unsubscribe ends it: the messages
// routed to the subscription before the bus heard of it are still handled,
// marked Late, then no more.
type Subscription interface{ Unsubscribe() error }

// Bus carries messages between nodes. A Bus receives its own publishes (a
// single node runs edge and router on one Bus). Callers may reuse data once
// Publish or Request returns. After Close every call fails with an error
// wrapping ErrUnavailable. A handler call already running may finish after
// Unsubscribe returns; Close waits for running handlers, so a handler must
// not call Close.
type Bus interface {
	// Publish sends data to subject without waiting.
	Publish(ctx context.Context, subject string, data []byte, header map[string]string) error
	// Request sends data to subject and waits for the first reply, or for
	// ctx. It returns ErrNoResponders at once when nobody listens.
	Request(ctx context.Context, subject string, data []byte, header map[string]string) ([]byte, error)
	// Subscribe delivers every message on subject to h.
	Subscribe(subject string, h Handler) (Subscription, error)
	// QueueSubscribe delivers each message on subject to one member of queue.
	QueueSubscribe(subject, queue string, h Handler) (Subscription, error)
	// Close releases the bus and any embedded server.
	Close() error
}

// Subjects.
const (
	// InboundSubject carries device events to the agent side (queue group
	// QueueRouters): requests, acknowledged by the router that took them.
	InboundSubject = "hermes.in"
	// QueueRouters is the queue group of routers on InboundSubject.
	QueueRouters = "routers"
	devicePrefix = "hermes.dev."
	edgePrefix   = "hermes.edge."
)

// EdgeSubject is where an edge takes a wire.Batch: the outputs for devices
// its owner records name it for, in one request. An edge of a release
// before batches does not subscribe to it, so a request to it has no
// responders.
func EdgeSubject(edge string) string {
	return edgePrefix + EscapeToken(edge)
}

// EdgeOutputSubject is where an edge takes, one at a time, the outputs and
// controls (wire.Output, wire.Control) for the devices it holds: a sender
// reads the device's owner record and requests on the subject of the edge
// it names. One subscription per edge, not one per device, so a phone
// costs the bus nothing. An edge of a release before edge subjects does
// not subscribe to it: a request gets no responders, and the sender uses
// DeviceSubject.
func EdgeOutputSubject(edge string) string {
	return edgePrefix + EscapeToken(edge) + ".out"
}

// DeviceSubject is where frames for a device went before edge subjects:
// an edge of such a release subscribes to it for each device it holds,
// and an edge of this one does too when told to (Config.DeviceSubjects in
// pkg/edge, for a rolling upgrade). The device id is escaped so any id is
// one token.
//
// shim(v0.2.0): edges and senders of the release before edge subjects.
func DeviceSubject(device string) string {
	return devicePrefix + EscapeToken(device)
}

// EscapeToken makes s a single NATS subject token: bytes other than ASCII
// letters, digits, '-' and '_' become %XX. The mapping is one-to-one.
func EscapeToken(s string) string {
	clean := len(s) > 0
	for i := 0; i < len(s) && clean; i++ {
		clean = tokenByte(s[i])
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) * 3)
	const hex = "0123456789ABCDEF"
	if s == "" {
		return "%"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if tokenByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}
