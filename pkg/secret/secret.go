// Package secret is the one type for tokens and keys: it never prints, in
// fmt's verbs, logs, JSON or -help. Its value is read with string(s).
package secret

import "log/slog"

// Secret is a token or key.
type Secret string

const redacted = "[redacted]"

// String shows that a value is set, never the value: "" when empty.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString keeps the value out of %#v.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// LogValue keeps the value out of logs.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText keeps the value out of JSON and other encodings.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Set makes *Secret a flag.Value.
func (s *Secret) Set(v string) error { *s = Secret(v); return nil }
