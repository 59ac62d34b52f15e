package dispatch

import (
	"errors"

	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Outcome is what became of an output (Dispatcher.Send) or of a delivery
// (Deliverer.Deliver): one value from the edge's answer to each surface's
// (the router API's status, the deliver frame's answer, the agent's
// outbox), which each surface turns into its answer with one switch. The
// edge's answers keep their wire names (wire.Outcome).
type Outcome string

// Outcomes.
const (
	// Delivered: the phone has it (acknowledged, or written to a phone
	// that does not ack and no "wait":"ack").
	Delivered = Outcome(wire.OutcomeDelivered)
	// Written: written, but the phone, which acknowledges what it
	// displays, did not acknowledge it in time: it may not have it.
	Written = Outcome(wire.OutcomeWritten)
	// Offline: no edge holds the device, or the one that did could not
	// write (no socket, a write failed, no answer in time, or the device
	// kept moving between edges).
	Offline = Outcome(wire.OutcomeOffline)
	// Gone: the output refers to media that no longer exists in the store.
	Gone = Outcome(wire.OutcomeGone)
	// Queued: (a part of) a delivery with a ttl did not reach the device
	// and is kept in its outbox for the ttl, to be sent on its next
	// connection. Deliver's only.
	Queued Outcome = "queued"
	// Refused: the deliver is not one this gateway takes (a target naming
	// no device, a ttl past the outbox's); Delivery.Refusal says why.
	// Deliver's only.
	Refused Outcome = "refused"

	// moved: the device is held under a newer epoch than the one the
	// output carried; Send looks the owner up again and never returns it.
	moved = Outcome(wire.OutcomeMoved)
)

// ErrGone is the error an agent's output gets for media that no longer
// exists in the store (Gone): it is not kept, since it would fail again on
// the next connection.
var ErrGone = errors.New("media no longer exists")

// The statuses of the spans of outputs that did not get there (SpanErr).
var (
	errOffline = errors.New("device offline")
	errWritten = errors.New("written, but not acknowledged by the phone")
	errRefused = errors.New("deliver refused")
)

// SpanErr is the status the span of one output ends with, once Send
// answered o and err: err, or nil when the phone has the output or it was
// kept, or else an error naming o.
func SpanErr(o Outcome, err error) error {
	if err != nil {
		return err
	}
	switch o {
	case Delivered, Queued:
		return nil
	case Written:
		return errWritten
	case Gone:
		return ErrGone
	case Refused:
		return errRefused
	}
	return errOffline
}
