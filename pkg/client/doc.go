// Package client is a Go client for Protocol v1 of the Hermes mobile gateway:
// one WebSocket, one JSON object per message (see pkg/protocol for the frame
// types and limits). It is what the black-box tests of the gateway, the load
// generator and Go users speak the protocol with, so besides the well-behaved
// senders it can also send what a broken or hostile phone would: raw bytes,
// invalid UTF-8, fragmented messages, a frame header announcing more than is
// ever sent.
//
// # Connecting
//
//	c, err := client.Dial(ctx, "ws://127.0.0.1:8787/ws", client.Options{
//		LocalAddr: netip.MustParseAddr("127.0.0.5"),              // source address
//		Header:    http.Header{"X-Forwarded-For": {"203.0.113.9"}}, // extra handshake headers
//		Timeout:   5 * time.Second,                               // dial + handshake
//	})
//	if err != nil { ... }
//	defer c.Close()
//	ready, err := c.Hello(ctx, token, protocol.Device{ID: "tel-1"}, protocol.User{ID: "u-1"})
//	// err is a *ServerError when the server answered hello with an error frame.
//
// # Receiving
//
// Every Conn has exactly one goroutine of its own, the reader. It reads
// WebSocket messages (reassembling fragmented ones, answering pings with
// pongs and a close frame with a close frame) and decodes each into a Frame,
// the JSON object it carried behind typed getters (T, Str, Int, Bool, Map,
// Get, Raw, ...), which it puts on a buffered channel (Options.Buffer). The reader never waits
// for a writer, so a long write (a 16 MiB frame, say) can be in progress while
// the server's answer to it is read and delivered.
//
// The consumer side reads that stream in order:
//
//   - Next returns the next frame. A WebSocket close from the server is
//     delivered as a Frame whose T() is "" and whose Close() is non-nil;
//     after it (or after the connection is lost or closed) Next returns an
//     error wrapping io.EOF.
//   - Expect skips frames until one of the given type arrives; the skipped
//     frames are consumed. ExpectClose does the same for the close frame.
//   - CollectMessage and CollectMedia pluck the frames of one agent message or
//     one media file out of the stream and reassemble them (message edits and
//     chunks; media parts), keeping every other frame, in order, in a backlog
//     that Next, Expect and the next Collect read first.
//
// A frame that is not a JSON object, is not valid UTF-8 or came in a binary
// message is still delivered (Raw has its bytes), but Next and Expect return
// it together with an error, so a misbehaving server fails the test.
//
// # Sending
//
// Send JSON-encodes any value; the typed helpers (Hello, Text, Audio, Media,
// UploadFile, Answer, Ping, Typing, Ack, Deliver) build the frames of the
// specification. SendRaw, SendBinary, SendFragmented and the pair
// SendHeaderOnly/SendPayload put arbitrary bytes on the wire. All senders are
// safe for concurrent use: writes are serialized by a mutex, and every frame
// is masked, as a client must.
//
// # Closing
//
// Close performs the WebSocket closing handshake (code 1000) and closes the
// socket; CloseNow drops the TCP connection without a close frame, as a phone
// losing its network would.
package client
