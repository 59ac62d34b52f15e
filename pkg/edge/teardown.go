package edge

// closeReason says why the edge tears a connection down, when the edge
// or the closing handshake decided it: one value per cause, which names it
// (the debug log's reason), says whether the edge cut the peer rather than
// the peer going away (by="edge" in hermes_closes_total, for a socket that
// ended without a close frame) and, for a slow reader, gives the reason
// label of hermes_slow_reader_closes_total. teardown takes one of these,
// or the socket's own error (an EOF, a reset, a read deadline), which
// names no cause of the edge's.
type closeReason struct {
	text string
	cut  bool   // the edge dropped the peer
	slow string // slowReaderQueueFull or slowReaderStalled; "" for no slow reader
}

func (r *closeReason) Error() string { return r.text }

// The causes of a teardown, one value each.
var (
	// errClientClosed: the closing handshake is over: the peer's close
	// frame was answered, or ours waited its linger time.
	errClientClosed = &closeReason{text: "client closed the connection"}
	// errSlowReader: more than MaxOutboundBytes queued unwritten, or the
	// edge-wide MaxQueuedBytes passed.
	errSlowReader = &closeReason{text: "slow reader: outbound queue full", cut: true, slow: slowReaderQueueFull}
	// errWriteStalled wraps the deadline error of a write that made no
	// progress for WriteTimeout.
	errWriteStalled = &closeReason{text: "slow reader: no write progress", cut: true, slow: slowReaderStalled}
	// errPingTimeout: the peer sent nothing, not even a pong, for
	// (1+PingMisses) ping intervals.
	errPingTimeout = &closeReason{text: "no pong: keepalive timed out", cut: true}
	// errEvicted: the socket had not said hello, and its place in the
	// hello phase went to a newcomer (see admission.go).
	errEvicted = &closeReason{text: "pushed out of the hello phase for a newcomer", cut: true}
	// errServerClosed: Close dropped what was left after the close frames.
	errServerClosed = &closeReason{text: "server closed", cut: true}
)
