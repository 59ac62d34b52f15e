// Package ids makes random identifiers (crypto/rand, which does not fail).
package ids

import (
	"crypto/rand"
	"encoding/hex"
)

// Hex is n random bytes in hex (2n characters).
func Hex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// New is prefix, a dash and 8 random bytes in hex.
func New(prefix string) string { return prefix + "-" + Hex(8) }
