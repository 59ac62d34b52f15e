package bus_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/hermes-mobile/gateway/pkg/bus"
)

var tokenInputs = []string{
	"", "a", "A", "a.b", "a b", "a%2Eb", "a%2eb", "%", "%%", "%25", "*", ">", ".", "..",
	"a*", "a>", "a\tb", "a\nb", "a\rb", "\x00", "\xff", "-", "_", "a-b_c",
	"device-42", "Device_42", "ünïcødé", "設備", "😀", "u\u00a0v", "a/b", "a:b",
	"%E8%A8%AD%E5%82%99", "abc%", "ABC",
}

func TestEscapeTokenOneToOne(t *testing.T) {
	seen := map[string]string{}
	for _, in := range tokenInputs {
		out := bus.EscapeToken(in)
		if prev, ok := seen[out]; ok {
			t.Errorf("EscapeToken(%q) = EscapeToken(%q) = %q", in, prev, out)
		}
		seen[out] = in
		checkToken(t, in, out)
	}
}

func TestEscapeTokenKnown(t *testing.T) {
	for in, want := range map[string]string{
		"":            "%",
		"abc-XYZ_09":  "abc-XYZ_09",
		"a.b":         "a%2Eb",
		"a b":         "a%20b",
		"a%2Eb":       "a%252Eb",
		"*":           "%2A",
		">":           "%3E",
		"é":           "%C3%A9",
		"dev.ice>*\t": "dev%2Eice%3E%2A%09",
	} {
		if got := bus.EscapeToken(in); got != want {
			t.Errorf("EscapeToken(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDeviceSubject(t *testing.T) {
	seen := map[string]string{}
	for _, in := range tokenInputs {
		subj := bus.DeviceSubject(in)
		tok, ok := strings.CutPrefix(subj, "hermes.dev.")
		if !ok {
			t.Errorf("DeviceSubject(%q) = %q, want prefix hermes.dev.", in, subj)
			continue
		}
		checkToken(t, in, tok)
		if prev, ok := seen[subj]; ok {
			t.Errorf("DeviceSubject(%q) = DeviceSubject(%q) = %q", in, prev, subj)
		}
		seen[subj] = in
	}
}

func FuzzEscapeToken(f *testing.F) {
	for _, in := range tokenInputs {
		f.Add(in, in+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := bus.EscapeToken(a), bus.EscapeToken(b)
		checkToken(t, a, ea)
		if a != b && ea == eb {
			t.Errorf("EscapeToken(%q) = EscapeToken(%q) = %q", a, b, ea)
		}
	})
}

// checkToken fails unless out is one non-empty NATS token of ASCII letters,
// digits, '-', '_' and '%'.
func checkToken(t *testing.T, in, out string) {
	t.Helper()
	if out == "" {
		t.Errorf("EscapeToken(%q) is empty", in)
	}
	if strings.ContainsAny(out, ".*>") || strings.IndexFunc(out, unicode.IsSpace) >= 0 {
		t.Errorf("EscapeToken(%q) = %q: has a separator, wildcard or space", in, out)
	}
	for i := 0; i < len(out); i++ {
		c := out[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '%') {
			t.Errorf("EscapeToken(%q) = %q: byte %q at %d", in, out, c, i)
		}
	}
}
