package wire

// Batch is many Outputs for devices that one edge holds, in one request on
// the edge's subject (bus.EdgeSubject), so that a fan-out of cron's
// deliveries costs a bus round trip per edge instead of one per delivery.
// Each Output carries its device's epoch, as on the device's subject, and
// the edge treats it as it would there, with one difference: an Output for
// a device it does not hold at that epoch is answered OutcomeMoved instead
// of being left to another edge, and the sender sends it again on the
// device's subject. The Outputs of one device are written in order.
type Batch struct {
	Outputs []Output `json:"outputs"`
}

// BatchReply answers a Batch: one Reply per Output, in order.
type BatchReply struct {
	Replies []Reply `json:"replies"`
}

// MaxBatchBytes bounds the encoded Outputs of one Batch: far under NATS's
// default 1 MiB payload. An Output larger than this alone travels alone.
const MaxBatchBytes = 256 << 10
