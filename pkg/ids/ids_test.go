package ids

import (
	"strings"
	"testing"
)

func TestIDs(t *testing.T) {
	seen := make(map[string]bool)
	for range 1000 {
		id := New("m")
		if !strings.HasPrefix(id, "m-") || len(id) != 2+16 || seen[id] {
			t.Fatalf("id %q: want m- and 16 new hex digits", id)
		}
		seen[id] = true
	}
	if h := Hex(4); len(h) != 8 || strings.Trim(h, "0123456789abcdef") != "" {
		t.Fatalf("Hex(4) = %q", h)
	}
}
