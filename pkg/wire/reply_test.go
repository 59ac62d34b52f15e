package wire_test

import (
	"encoding/json"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/wire"
)

// oldReply is wire.Reply as the release before Outcome had it: five
// booleans and the error.
type oldReply struct {
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
	Moved   bool   `json:"moved,omitzero"`
	Gone    bool   `json:"gone,omitzero"`
	Acked   bool   `json:"acked,omitzero"`
	Unacked bool   `json:"unacked,omitzero"`
}

// oldResult is how a router of that release read a reply (its
// dispatch.SendAcked and POST /v1/deliver's 202 for "wait":"ack").
func oldResult(r oldReply, waitAck bool) wire.Outcome {
	switch {
	case r.Moved:
		return wire.OutcomeMoved
	case r.Gone:
		return wire.OutcomeGone
	case !r.OK:
		return wire.OutcomeOffline
	case r.Unacked, waitAck && !r.Acked:
		return wire.OutcomeWritten
	}
	return wire.OutcomeDelivered
}

// TestReplyAcrossReleases: during a rolling upgrade an edge of the
// release before Outcome answers a router of this one, and the other way
// round. What an old edge wrote (JSON literals of its replies) reads as
// the outcome it meant; what a new edge writes reads, to an old router,
// as the same outcome; and a new reply reads back as its own outcome.
//
// shim(v0.2.0): tests the booleans.
func TestReplyAcrossReleases(t *testing.T) {
	for _, tc := range []struct {
		old     string // what an edge of the earlier release answered
		waitAck bool   // for an output with WaitAck
		want    wire.Outcome
	}{
		{`{"ok":true,"acked":true}`, false, wire.OutcomeDelivered},
		{`{"ok":true,"acked":true}`, true, wire.OutcomeDelivered},
		{`{"ok":true}`, false, wire.OutcomeDelivered}, // a phone that does not ack, written
		{`{"ok":true}`, true, wire.OutcomeWritten},    // asked to wait, not acked
		{`{"ok":true,"error":"written, but the phone did not acknowledge it","unacked":true}`, false, wire.OutcomeWritten},
		{`{"ok":true,"error":"written, but the phone did not acknowledge it","unacked":true}`, true, wire.OutcomeWritten},
		{`{"ok":false,"error":"device moved","moved":true}`, false, wire.OutcomeMoved},
		{`{"ok":false,"error":"blob not found","gone":true}`, false, wire.OutcomeGone},
		{`{"ok":false,"error":"device not connected"}`, false, wire.OutcomeOffline},
		{`{"ok":false,"error":"client closed"}`, true, wire.OutcomeOffline},
	} {
		var r wire.Reply
		if err := wire.Unmarshal([]byte(tc.old), &r); err != nil {
			t.Fatalf("%s: %v", tc.old, err)
		}
		if got := r.Result(tc.waitAck); got != tc.want {
			t.Errorf("an old edge's %s (wait ack %v) reads as %q, want %q", tc.old, tc.waitAck, got, tc.want)
		}
	}

	for _, o := range []wire.Outcome{wire.OutcomeDelivered, wire.OutcomeWritten, wire.OutcomeMoved, wire.OutcomeOffline, wire.OutcomeGone} {
		data, err := wire.Marshal(wire.OutputReply(o, "why"))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil || m["outcome"] != string(o) {
			t.Errorf("a new edge's reply %s does not name its outcome %q", data, o)
		}
		var old oldReply
		if err := json.Unmarshal(data, &old); err != nil {
			t.Fatal(err)
		}
		var r wire.Reply
		if err := wire.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		for _, waitAck := range []bool{false, true} {
			if got := oldResult(old, waitAck); got != o {
				t.Errorf("an old router reads the new edge's %s (wait ack %v) as %q", data, waitAck, got)
			}
			if got := r.Result(waitAck); got != o {
				t.Errorf("a new router reads %s (wait ack %v) as %q", data, waitAck, got)
			}
		}
	}
}

// TestEncodeOutputReply: the shared encodings are what Marshal makes of
// OutputReply, for every outcome, with and without an error text.
func TestEncodeOutputReply(t *testing.T) {
	for _, o := range []wire.Outcome{wire.OutcomeDelivered, wire.OutcomeWritten, wire.OutcomeMoved, wire.OutcomeOffline, wire.OutcomeGone} {
		for _, errText := range []string{"", "device not connected"} {
			want, err := wire.Marshal(wire.OutputReply(o, errText))
			if err != nil {
				t.Fatal(err)
			}
			if got := wire.EncodeOutputReply(o, errText); string(got) != string(want) {
				t.Errorf("EncodeOutputReply(%s, %q) = %s, want %s", o, errText, got, want)
			}
		}
	}
}
