// Package wire holds the messages that travel on the bus between edges and
// routers: Event (a device said something, for the agent) and Output (the
// agent or cron says something to a device). They are JSON-encoded; large
// bytes never travel inline, only blob keys of the store.
package wire

import "github.com/hermes-mobile/gateway/pkg/protocol"

// Event kinds.
const (
	EventText   = "text"
	EventAudio  = "audio"
	EventMedia  = "media"
	EventPrompt = "prompt" // a card was answered or expired
)

// Event is what a device sent, as the agent sees it.
type Event struct {
	Kind    string `json:"kind"`
	Session string `json:"session"` // mobile:<device>
	Device  string `json:"device"`
	// Device is authenticated: the edge admitted it with Auth, the kind of
	// token it showed: "device" (its own token of MOBILE_EXTRA_TOKENS), "app"
	// (MOBILE_TOKEN, shared by every phone) or "deliver". UserID and User are
	// what the phone's hello claims: display only, never an identity.
	Auth   string `json:"auth,omitempty"`
	UserID string `json:"user_id,omitempty"`
	User   string `json:"user,omitempty"`
	ID     string `json:"id,omitempty"` // the client's message id
	Text   string `json:"text,omitempty"`
	// Audio and media: the bytes are in the store under Media.Blob.
	Format string     `json:"format,omitempty"` // audio: wav or ogg
	Media  *MediaRef  `json:"media,omitempty"`
	Prompt *PromptRef `json:"prompt,omitempty"`
	// TraceParent carries the W3C trace context of the frame that caused it.
	TraceParent string `json:"traceparent,omitempty"`
	// Edge is the edge that took the event from the phone: where the
	// answer goes if the store lost the device's owner record (Output.Via).
	Edge string `json:"edge,omitempty"`
	// Epoch is the owner epoch of the socket the event came through on
	// Edge (0: unknown, an edge of an earlier release). The answer's
	// outputs start from that owner instead of reading it (an owner that
	// may be stale, as a cached one: the edge fences it).
	Epoch int64 `json:"epoch,omitzero"`
}

// MediaRef points at a file kept in the store.
type MediaRef struct {
	Kind     string `json:"kind"`
	Mime     string `json:"mime"`
	Filename string `json:"filename,omitempty"`
	Caption  string `json:"caption,omitempty"`
	Size     int    `json:"size"`
	Blob     string `json:"blob,omitempty"` // store blob key
	URL      string `json:"url,omitempty"`  // or a link the app fetches itself
	ReplyTo  string `json:"reply_to,omitempty"`
}

// PromptRef is the outcome of a card.
type PromptRef struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Option  string `json:"option"`         // the applied option
	Text    string `json:"text,omitempty"` // custom answer (clarify other)
	Expired bool   `json:"expired,omitzero"`
}

// Output ops.
const (
	OpMessage    = "message"     // Text, chunked by the edge; Edit, Final
	OpMedia      = "media"       // Media, chunked by the edge
	OpPrompt     = "prompt"      // Prompt card
	OpPromptDone = "prompt_done" // PromptDone
	OpTyping     = "typing"      // Stop
	OpAvatar     = "avatar"      // State
)

// Control ops.
const (
	// OpTakeover: a socket of the device got ready under Epoch; an edge
	// holding an older socket of it closes that one.
	OpTakeover = "takeover"
	// OpOutbox is published after an output went to the device's outbox:
	// the device may have come online meanwhile and read its outbox
	// already, so the edge holding it reads it again.
	OpOutbox = "outbox"
)

// Control is a message between gateway nodes about a device, not output
// for it: Op is OpTakeover or OpOutbox. It travels on the device's subject
// with the outputs, whose "op", "device" and "epoch" members it shares, so
// one decode of an Output tells them apart (IsControl).
type Control struct {
	Op     string `json:"op"`
	Device string `json:"device"`
	Epoch  int64  `json:"epoch,omitzero"`
}

// IsControl reports whether op is a Control op.
func IsControl(op string) bool { return op == OpTakeover || op == OpOutbox }

// Output is one thing to show on a device. Epoch is the device owner's epoch
// when it was sent: an edge whose socket has another epoch does not answer.
type Output struct {
	Op     string `json:"op"`
	Device string `json:"device"`
	Epoch  int64  `json:"epoch,omitzero"`
	// Cached: the sender took Epoch from its owner cache, so it may be
	// stale. The edge at that epoch writes only once the device's owner
	// record confirms it: the takeover notice of a newer socket may not
	// have reached it yet (on a NATS cluster it crosses other routes).
	Cached     bool             `json:"cached,omitzero"`
	ID         string           `json:"id,omitempty"`
	Text       string           `json:"text,omitempty"`
	Edit       bool             `json:"edit,omitzero"`
	Final      bool             `json:"final,omitzero"`
	Media      *MediaRef        `json:"media,omitempty"`
	Prompt     *protocol.Prompt `json:"prompt,omitempty"`
	PromptDone *PromptDone      `json:"prompt_done,omitempty"`
	Stop       bool             `json:"stop,omitzero"`
	State      string           `json:"state,omitempty"`
	// Offline is set by the outbox when the output waited for the device.
	Offline bool `json:"offline,omitzero"`
	// WaitAck asks the edge to answer only once the phone acknowledged the
	// output (or AckWait passed), also when the phone has not acked on its
	// socket yet.
	WaitAck bool `json:"wait_ack,omitzero"`
	// TraceParent is the W3C trace context of the sender's span for this
	// output alone, set when one bus message carries several (a Batch,
	// whose header names one context for all): the edge's edge.deliver
	// continues it rather than the header's. Empty otherwise, and when
	// untraced; an edge of a release before it ignores it.
	TraceParent string `json:"traceparent,omitempty"`
	// Via is the edge to try when the device has no owner record (the
	// store lost it): the edge its event came from. The sender's own
	// hint; it does not cross the bus.
	Via string `json:"-"`
}

// PromptDone closes a card on the device.
type PromptDone struct {
	ID       string `json:"id"`
	OptionID string `json:"option_id,omitempty"`
	Expired  bool   `json:"expired,omitzero"`
}

// Reply answers an Output or an Event request. An Output's answer is its
// Outcome; an Event's is OK (the router took it).
type Reply struct {
	Outcome Outcome `json:"outcome,omitempty"`
	OK      bool    `json:"ok"`
	Error   string  `json:"error,omitempty"`

	// shim(v0.2.0): the booleans Outcome replaced.
	//
	// The booleans the Outcome replaced. OutputReply still writes them
	// and Result reads them when Outcome is absent, so that edges and
	// routers of the release before Outcome and of this one understand
	// each other during a rolling upgrade (docs/operations.md). The
	// release after this one drops them.
	Moved   bool `json:"moved,omitzero"`   // OutcomeMoved
	Gone    bool `json:"gone,omitzero"`    // OutcomeGone
	Acked   bool `json:"acked,omitzero"`   // OutcomeDelivered
	Unacked bool `json:"unacked,omitzero"` // OutcomeWritten (with OK)
}

// OutputReply is the answer to an Output that came to o; errText says
// why, for the outcomes that are not delivered.
func OutputReply(o Outcome, errText string) Reply {
	return Reply{
		Outcome: o, Error: errText,
		OK: o == OutcomeDelivered || o == OutcomeWritten,
		// shim(v0.2.0): the booleans, for a router of the release before Outcome.
		Moved: o == OutcomeMoved, Gone: o == OutcomeGone,
		Acked: o == OutcomeDelivered, Unacked: o == OutcomeWritten,
	}
}

// outcomes are the Outcomes an edge answers with.
var outcomes = []Outcome{OutcomeDelivered, OutcomeWritten, OutcomeMoved, OutcomeOffline, OutcomeGone}

// encodedReplies holds OutputReply(o, "") encoded, for each of outcomes.
var encodedReplies = func() map[Outcome][]byte {
	m := make(map[Outcome][]byte, len(outcomes))
	for _, o := range outcomes {
		m[o], _ = Marshal(OutputReply(o, ""))
	}
	return m
}()

// EncodeOutputReply returns OutputReply(o, errText) encoded. Without an
// error text the encoding is made once per Outcome and shared, since an
// edge answers every delivery with one: callers must not change it.
func EncodeOutputReply(o Outcome, errText string) []byte {
	if b, ok := encodedReplies[o]; ok && errText == "" {
		return b
	}
	b, _ := Marshal(OutputReply(o, errText))
	return b
}

// Result is what became of the Output r answers: its Outcome, or, from an
// edge of the release before Outcome, what its booleans say. waitAck is
// the Output's WaitAck: such an edge answered ok without acked when the
// phone did not acknowledge an Output that asked for it.
func (r Reply) Result(waitAck bool) Outcome {
	if r.Outcome != "" {
		return r.Outcome
	}
	// shim(v0.2.0): an edge of the release before Outcome.
	switch {
	case r.Moved:
		return OutcomeMoved
	case r.Gone:
		return OutcomeGone
	case !r.OK:
		return OutcomeOffline
	case r.Unacked, waitAck && !r.Acked:
		return OutcomeWritten
	}
	return OutcomeDelivered
}

// Outcome is what became of an Output sent to a device's edge.
type Outcome string

// Outcomes.
const (
	// OutcomeDelivered: the phone has it: it acknowledged it, or it was
	// written to a phone that does not ack and no ack was asked for.
	OutcomeDelivered Outcome = "delivered"
	// OutcomeWritten: written, but the phone did not acknowledge it in
	// time (it acks, or the output asked for WaitAck): it may not have it.
	OutcomeWritten Outcome = "written"
	// OutcomeMoved: the device is held under a newer epoch than the
	// output's, or its socket is closing; the sender reads the owner
	// again and resends.
	OutcomeMoved Outcome = "moved"
	// OutcomeOffline: the edge could not write it (no socket, a write
	// that failed).
	OutcomeOffline Outcome = "offline"
	// OutcomeGone: the output refers to media that no longer exists;
	// resending cannot help.
	OutcomeGone Outcome = "gone"
)
