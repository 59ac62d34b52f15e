package wire

import (
	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Marshal encodes a message for the bus or the store: JSON by
// github.com/go-json-experiment/json, the library the router API and the
// protocol decoder use (member names are matched exactly). A string with
// invalid UTF-8 is written with U+FFFD in its place, as encoding/json did,
// rather than failing the message.
func Marshal(v any) ([]byte, error) { return json.Marshal(v, jsontext.AllowInvalidUTF8(true)) }

// Unmarshal decodes a message Marshal encoded. Members it does not know
// are ignored, so a node reads the messages of a newer one.
func Unmarshal(data []byte, v any) error {
	return json.Unmarshal(data, v, jsontext.AllowInvalidUTF8(true))
}
