package edge

import (
	"fmt"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// failure names one way the edge fails a phone's frame on its own side:
// the store, the bus or the agent cannot be reached, a budget is spent, a
// caught bug. Every one is the wire code internal_error (protocol-v1);
// its text, what the phone is told to do about it, is the message. The
// texts with verbs take their arguments in frame.
type failure string

// The failures, one name each (several share a text: the phone does the
// same about them).
const (
	failPanic         failure = "internal error"                                                              // a frame's handler panicked
	failReadBudget    failure = "the gateway is reading too many large messages; reconnect and send it again" // fatal: the edge's read budget is spent
	failClaimDevice   failure = "gateway storage unavailable; reconnect later"                                // fatal: hello's claim of the device
	failSubscribe     failure = "gateway bus unavailable; reconnect later"                                    // fatal: hello's subscription for the device
	failConnQuota     failure = "owner %s has %d connections open, its connections quota; reconnect later"    // fatal: hello past its owner's quota
	failTextPending   failure = "this message is still being delivered from another connection; send it again shortly"
	failTextDedup     failure = "gateway storage unavailable; send again" // the dedup claim of a message's id
	failMediaStore    failure = "gateway storage unavailable; send again" // storing a message's file
	failMediaFull     failure = "the gateway's media store is full; send again later"
	failTextAgent     failure = "the agent is not reachable; send again"
	failUploadBudget  failure = "the gateway's upload buffers are full; send this part again later"
	failUploadStore   failure = "gateway storage unavailable; send the file again"
	failPromptStore   failure = "gateway storage unavailable; answer again"
	failPromptAgent   failure = "the agent is not reachable; answer the card again"
	failPushStore     failure = "push: gateway storage unavailable; send it again"
	failDeliverClosed failure = "deliver %s: the gateway is shutting down; deliver it again" // the deliver's id
	failDeliver       failure = "deliver %s to %s failed; deliver it again"                  // the deliver's id and device: the store or the bus failed
)

// frame is the error frame of f, its verbs filled with args.
func (f failure) frame(args ...any) *protocol.Error {
	msg := string(f)
	if len(args) > 0 {
		msg = fmt.Sprintf(msg, args...)
	}
	return protocol.NewError(protocol.CodeInternalError, msg)
}
