// Package wsconformance checks the edge's WebSocket layer against RFC 6455,
// case by case, on the lines of the Autobahn testsuite's groups 1 to 7
// (framing, ping/pong, reserved bits, opcodes, fragmentation, UTF-8, close).
// A raw-socket client on loopback writes the bytes of each case to a real
// edge and checks what comes back.
//
// The edge speaks Protocol v1, not echo: a message is a JSON frame, so the
// cases send {"t":"ping","ts":…} and expect the pong that echoes ts where
// Autobahn expects an echo. Where the protocol decides (a text message that
// is not UTF-8 is a non-fatal bad_frame error, protocol-v1 "Frames"), the
// protocol is followed; everything at the WebSocket level follows the RFC.
package wsconformance
