package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/gobwas/ws"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Frame is one message from the server: the members of the JSON object it
// carried, its original bytes, and, for the WebSocket close the server
// sent, the close code and reason. Read members with Str, Int, Float, Bool,
// Map, Slice or Get; numbers are json.Number, nested objects are read with
// Map as Frames. The zero Frame is no message (IsZero).
type Frame struct {
	fields map[string]any
	raw    []byte
	close  *CloseInfo
	err    error
}

// CloseInfo is the WebSocket close frame the server sent. Code is 1005 (no
// status received) when the close frame had no body.
type CloseInfo struct {
	Code   int
	Reason string
}

func (ci *CloseInfo) String() string {
	if ci.Reason == "" {
		return strconv.Itoa(ci.Code)
	}
	return strconv.Itoa(ci.Code) + " " + ci.Reason
}

// IsZero reports whether f is no message at all: what Next returns with an
// error.
func (f Frame) IsZero() bool {
	return f.fields == nil && f.raw == nil && f.close == nil && f.err == nil
}

// T is the frame type, t, exactly as the server sent it; "" for a close.
func (f Frame) T() string { return f.Str("t") }

// Close is the close code and reason when this frame stands for the
// WebSocket close the server sent, and nil for every other frame.
func (f Frame) Close() *CloseInfo { return f.close }

// Raw is the original bytes of the message (for a close frame: its body, the
// code and the reason). It is nil for a Frame that was not received.
func (f Frame) Raw() []byte { return f.raw }

// Err says why the message did not decode into a JSON object (not JSON, not
// an object, trailing data, invalid UTF-8, a binary message); nil when it did.
func (f Frame) Err() error { return f.err }

// Has reports whether the server sent the member key (even as null).
func (f Frame) Has(key string) bool {
	_, ok := f.fields[key]
	return ok
}

// Get is the member key as decoded (string, json.Number, bool, nil,
// map[string]any, []any), and nil when there is none.
func (f Frame) Get(key string) any { return f.fields[key] }

// Str is the member key if it is a string, and "" otherwise.
func (f Frame) Str(key string) string {
	s, _ := f.fields[key].(string)
	return s
}

// Int is the member key if it is a number (truncated toward zero), and 0
// otherwise.
func (f Frame) Int(key string) int {
	if v, ok := f.fields[key].(json.Number); ok {
		if i, err := v.Int64(); err == nil {
			return int(i)
		}
		fl, _ := v.Float64()
		return int(fl)
	}
	return 0
}

// Float is the member key if it is a number, and 0 otherwise.
func (f Frame) Float(key string) float64 {
	if v, ok := f.fields[key].(json.Number); ok {
		fl, _ := v.Float64()
		return fl
	}
	return 0
}

// Bool is the member key if it is a boolean, and false otherwise.
func (f Frame) Bool(key string) bool {
	b, _ := f.fields[key].(bool)
	return b
}

// Map is the member key if it is an object, and the zero Frame otherwise.
func (f Frame) Map(key string) Frame { return Object(f.fields[key]) }

// Object is v as a Frame when it is a JSON object as Get or Slice return
// one (a map[string]any), and the zero Frame otherwise: the elements of an
// array of objects are read with it.
func Object(v any) Frame {
	if m, ok := v.(map[string]any); ok {
		return Frame{fields: m}
	}
	return Frame{}
}

// Slice is the member key if it is an array, and nil otherwise.
func (f Frame) Slice(key string) []any {
	s, _ := f.fields[key].([]any)
	return s
}

// Fields is a copy of the members the server sent.
func (f Frame) Fields() map[string]any {
	m := make(map[string]any, len(f.fields))
	for k, v := range f.fields {
		m[k] = v
	}
	return m
}

// String is the original message, or a description of the close.
func (f Frame) String() string {
	if ci := f.Close(); ci != nil {
		return "close " + ci.String()
	}
	if f.raw != nil {
		return string(f.raw)
	}
	b, err := json.Marshal(f.fields)
	if err != nil {
		return fmt.Sprint(f.fields)
	}
	return string(b)
}

// MarshalJSON encodes the members.
func (f Frame) MarshalJSON() ([]byte, error) { return json.Marshal(f.Fields()) }

// describe names a frame briefly, for error messages.
func (f Frame) describe() string {
	if ci := f.Close(); ci != nil {
		return "close(" + ci.String() + ")"
	}
	switch t := f.T(); t {
	case "":
		s := f.String()
		if len(s) > 60 {
			s = s[:60] + "..."
		}
		return strconv.Quote(s)
	case protocol.TypeError:
		return "error(" + f.Str("code") + ")"
	case protocol.TypeMessage, protocol.TypeMedia:
		return t + "(" + f.Str("id") + ")"
	case protocol.TypeAvatar:
		return "avatar(" + f.Str("state") + ")"
	default:
		return t
	}
}

// decodeFrame turns one WebSocket message from the server into a Frame.
func decodeFrame(op ws.OpCode, p []byte) Frame {
	f := Frame{raw: p}
	if op == ws.OpBinary {
		f.err = errors.New("client: server sent a binary message")
		return f
	}
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	err := dec.Decode(&obj)
	switch {
	case err != nil:
		f.err = fmt.Errorf("client: server sent a message that is not a JSON object: %v", err)
		return f
	case obj == nil:
		f.err = errors.New("client: server sent a message that is not a JSON object: null")
		return f
	}
	f.fields = obj
	if _, err := dec.Token(); err != io.EOF {
		f.err = errors.New("client: server sent data after the JSON object")
	} else if !utf8.Valid(p) {
		f.err = errors.New("client: server sent a message that is not valid UTF-8")
	}
	return f
}

// closeFrame is the Frame that stands for a close from the server.
func closeFrame(ci *CloseInfo, body []byte) Frame {
	return Frame{raw: body, close: ci}
}

// ServerError is an error frame the server sent where another frame was
// expected (Hello returns it when hello is answered with an error).
type ServerError struct {
	Code    protocol.Code
	Message string
	Fatal   bool
	Frame   Frame // the error frame itself
}

func (e *ServerError) Error() string {
	s := "client: server error " + string(e.Code)
	if e.Fatal {
		s += " (fatal)"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// AsServerError returns the error frame f as a *ServerError, or nil when f is
// not an error frame.
func AsServerError(f Frame) *ServerError {
	if f.T() != protocol.TypeError {
		return nil
	}
	return &ServerError{
		Code:    protocol.Code(f.Str("code")),
		Message: f.Str("message"),
		Fatal:   f.Bool("fatal"),
		Frame:   f,
	}
}
