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

// Frame is one message from the server, decoded as a JSON object. Numbers are
// json.Number (read them with Int or Float); nested objects are
// map[string]any (read them with Map).
//
// Besides the members the server sent, a Frame delivered by a Conn carries one
// hidden entry, under a key no JSON the gateway sends can produce, holding its
// original bytes and, for a WebSocket close, the close code and reason. Use
// Fields for the members alone (to range over them or compare them).
type Frame map[string]any

// metaKey holds the *frameMeta of a received frame.
const metaKey = "\x00client.meta"

type frameMeta struct {
	raw   []byte
	close *CloseInfo
	err   error
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

func (f Frame) meta() *frameMeta {
	m, _ := f[metaKey].(*frameMeta)
	return m
}

// T is the frame type, t, exactly as the server sent it; "" for a close.
func (f Frame) T() string { return f.Str("t") }

// Close is the close code and reason when this frame stands for the
// WebSocket close the server sent, and nil for every other frame.
func (f Frame) Close() *CloseInfo {
	if m := f.meta(); m != nil {
		return m.close
	}
	return nil
}

// Raw is the original bytes of the message (for a close frame: its body, the
// code and the reason). It is nil for a Frame that was not received.
func (f Frame) Raw() []byte {
	if m := f.meta(); m != nil {
		return m.raw
	}
	return nil
}

// Err says why the message did not decode into a JSON object (not JSON, not
// an object, trailing data, invalid UTF-8, a binary message); nil when it did.
func (f Frame) Err() error {
	if m := f.meta(); m != nil {
		return m.err
	}
	return nil
}

// Has reports whether the server sent the member key (even as null).
func (f Frame) Has(key string) bool {
	if key == metaKey {
		return false
	}
	_, ok := f[key]
	return ok
}

// Str is the member key if it is a string, and "" otherwise.
func (f Frame) Str(key string) string {
	s, _ := f[key].(string)
	return s
}

// Int is the member key if it is a number (truncated toward zero), and 0
// otherwise.
func (f Frame) Int(key string) int {
	switch v := f[key].(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return int(i)
		}
		fl, _ := v.Float64()
		return int(fl)
	case float64:
		return int(v)
	case int:
		return v
	case int64:
		return int(v)
	}
	return 0
}

// Float is the member key if it is a number, and 0 otherwise.
func (f Frame) Float(key string) float64 {
	switch v := f[key].(type) {
	case json.Number:
		fl, _ := v.Float64()
		return fl
	case float64:
		return v
	case int:
		return float64(v)
	case int64:
		return float64(v)
	}
	return 0
}

// Bool is the member key if it is a boolean, and false otherwise.
func (f Frame) Bool(key string) bool {
	b, _ := f[key].(bool)
	return b
}

// Map is the member key if it is an object, and nil otherwise.
func (f Frame) Map(key string) Frame {
	switch v := f[key].(type) {
	case map[string]any:
		return Frame(v)
	case Frame:
		return v
	}
	return nil
}

// Slice is the member key if it is an array, and nil otherwise.
func (f Frame) Slice(key string) []any {
	s, _ := f[key].([]any)
	return s
}

// Fields is a copy of the members the server sent, without the hidden entry.
func (f Frame) Fields() map[string]any {
	m := make(map[string]any, len(f))
	for k, v := range f {
		if k != metaKey {
			m[k] = v
		}
	}
	return m
}

// String is the original message, or a description of the close.
func (f Frame) String() string {
	if ci := f.Close(); ci != nil {
		return "close " + ci.String()
	}
	if raw := f.Raw(); raw != nil {
		return string(raw)
	}
	b, err := json.Marshal(f.Fields())
	if err != nil {
		return fmt.Sprint(f.Fields())
	}
	return string(b)
}

// MarshalJSON encodes the members, without the hidden entry.
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
	m := &frameMeta{raw: p}
	var obj map[string]any
	if op == ws.OpBinary {
		m.err = errors.New("client: server sent a binary message")
	} else {
		dec := json.NewDecoder(bytes.NewReader(p))
		dec.UseNumber()
		err := dec.Decode(&obj)
		switch {
		case err != nil:
			obj = nil
			m.err = fmt.Errorf("client: server sent a message that is not a JSON object: %v", err)
		case obj == nil:
			m.err = errors.New("client: server sent a message that is not a JSON object: null")
		default:
			if _, err := dec.Token(); err != io.EOF {
				m.err = errors.New("client: server sent data after the JSON object")
			} else if !utf8.Valid(p) {
				m.err = errors.New("client: server sent a message that is not valid UTF-8")
			}
		}
	}
	f := Frame(obj)
	if f == nil {
		f = Frame{}
	}
	f[metaKey] = m
	return f
}

// closeFrame is the Frame that stands for a close from the server.
func closeFrame(ci *CloseInfo, body []byte) Frame {
	return Frame{metaKey: &frameMeta{raw: body, close: ci}}
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
