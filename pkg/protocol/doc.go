// Package protocol is Protocol v1 of the Hermes mobile app: the frames a phone
// and the gateway exchange over one WebSocket, the limits of the
// specification as named constants, validation of every client frame, the
// error codes and the prompt option tables.
//
// It imports nothing of this module: the edge, the router, the agents and the
// Go client all speak the protocol through this package.
//
// Decode turns one WebSocket message into a typed client frame (Hello, Text,
// Audio, MediaUp, PromptAnswer, Typing, Ping, Ack, Deliver) or a *Error that
// carries the code the spec names for that input. The Append* functions encode
// server frames into a caller-owned buffer without reflection.
package protocol
