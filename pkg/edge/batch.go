package edge

import (
	"bytes"
	"sync"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// movedReply answers an output for a socket that is not here (any more).
var movedReply, _ = wire.Marshal(wire.OutputReply(wire.OutcomeMoved, "device moved"))

// onBatch handles a wire.Batch on this edge's subject: each output is
// written as onDelivery writes one from its device's subject (the same
// write, owner fence and wait for the phone's ack), and the answer holds
// each one's Reply, in order, once all are settled. An output for a device
// this edge does not hold at the output's epoch, or whose socket is
// closing, is answered "moved" (the sender sends it again on the device's
// subject, where whoever holds the device answers), and so is every later
// output of that device in the batch, so that a device's outputs keep their
// order.
func (s *Server) onBatch(m *bus.Msg) {
	if m.Respond == nil {
		return
	}
	var b wire.Batch
	if err := wire.Unmarshal(m.Data, &b); err != nil {
		s.log.Warn("unreadable batch", "subject", m.Subject, "err", err)
		return // the sender's request times out: the edge could not read it
	}
	n := len(b.Outputs)
	replies := make([][]byte, n)
	var mu sync.Mutex
	left := n
	answer := func(i int, data []byte) {
		mu.Lock()
		replies[i] = data
		left--
		last := left == 0
		mu.Unlock()
		if last {
			var buf bytes.Buffer
			buf.Grow(n*64 + 16)
			buf.WriteString(`{"replies":[`)
			for k, r := range replies {
				if k > 0 {
					buf.WriteByte(',')
				}
				buf.Write(r)
			}
			buf.WriteString("]}")
			_ = m.Respond(buf.Bytes()) // lost with the bus: the sender's request times out
		}
	}
	if n == 0 {
		_ = m.Respond([]byte(`{"replies":[]}`))
		return
	}
	moved := make(map[string]bool)
	for i, out := range b.Outputs {
		c := s.deviceConn(out.Device)
		if m.Late || moved[out.Device] || c == nil || out.Epoch == 0 || c.epoch.Load() != out.Epoch || c.isClosing() || wire.IsControl(out.Op) {
			moved[out.Device] = true
			answer(i, movedReply)
			continue
		}
		s.write(c, &bus.Msg{Subject: m.Subject, Header: m.Header, Respond: func(data []byte) error {
			answer(i, data)
			return nil
		}}, out, nil)
	}
}
