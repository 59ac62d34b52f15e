// Package agent is the seam between the gateway and whatever answers the
// phones: an Agent receives device events and speaks through an Output bound
// to the event's session. The router runs agents; Demo is built in.
package agent

import (
	"context"
	"time"

	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Agent answers device events. Handle is called once per event; events of
// one session arrive one at a time, in order.
type Agent interface {
	Handle(ctx context.Context, ev wire.Event, out Output) error
}

// Acceptor is an Agent that takes an event durably and at once (Link
// appends it to the event log). The router calls Accept before it
// acknowledges the event to the edge, so a router that dies right after the
// acknowledgement loses nothing, and events keep their arrival order.
type Acceptor interface {
	Accept(ctx context.Context, ev wire.Event) error
}

// Func adapts a function to Agent.
type Func func(ctx context.Context, ev wire.Event, out Output) error

// Handle calls f.
func (f Func) Handle(ctx context.Context, ev wire.Event, out Output) error { return f(ctx, ev, out) }

// Output speaks to one session. Every call returns once the device has the
// frames, or once they are kept in the device's outbox while it is offline.
type Output interface {
	// Message sends a message (final or a streaming part). edit replaces
	// the whole text of the message id with text; final marks the last part.
	Message(ctx context.Context, id, text string, edit, final bool) error
	// Media sends a file, chunked by the edge.
	Media(ctx context.Context, m Media) error
	// Prompt opens a card and returns its id; the answer arrives as an
	// EventPrompt, as does its expiry.
	Prompt(ctx context.Context, p Prompt) (string, error)
	// Typing shows the agent working (avatar thinking), or with stop clears
	// the indicator at once (avatar idle).
	Typing(ctx context.Context, stop bool) error
	// Avatar sets the avatar state (idle, thinking, speaking).
	Avatar(ctx context.Context, state string) error
	// Blob returns the bytes of an uploaded file (an event's Media.Blob).
	Blob(ctx context.Context, key string) ([]byte, error)
}

// Media is a file for the device: Data, or Blob (a store key, e.g. an
// uploaded file's), or URL for the app to fetch itself.
type Media struct {
	ID       string
	Kind     string // image, voice, video, document, animation
	Mime     string
	Filename string
	Caption  string
	Data     []byte
	Blob     string
	URL      string
	ReplyTo  string
}

// Prompt is a card to open. Choices are a clarify card's proposed answers.
type Prompt struct {
	Kind        string // exec_approval, slash_confirm, clarify
	Text        string
	Command     string // exec_approval: the exact command
	Description string // exec_approval: what it does
	Choices     []string
	// Options, when set, are the only buttons of an exec_approval or
	// slash_confirm card: a subset of the kind's table, in its order. The
	// safe option (deny, cancel) is always offered.
	Options []string
	// TTL, when set, is the card's lifetime instead of the router's
	// MOBILE_PROMPT_TTL, at most its MOBILE_PROMPT_MAX_TTL: a card answers
	// a wait of the agent and must neither outlive it nor end before it.
	TTL time.Duration
}
