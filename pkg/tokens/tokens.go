// Package tokens compares secrets in constant time: as fixed-length
// SHA-256 digests, looking at every configured token whatever matches.
package tokens

import (
	"crypto/sha256"
	"crypto/subtle"
	"strings"
)

// Digest is a token's SHA-256.
type Digest = [sha256.Size]byte

// Sum is the digest of token.
func Sum(token string) Digest { return sha256.Sum256([]byte(token)) }

// Equal compares two digests in constant time.
func Equal(a, b Digest) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

// Set is a list of tokens, kept as digests.
type Set []Digest

// NewSet keeps the digests of tokens, trimmed; empty ones are skipped.
func NewSet(tokens []string) Set {
	var s Set
	for _, t := range tokens {
		if t = strings.TrimSpace(t); t != "" {
			s = append(s, Sum(t))
		}
	}
	return s
}

// Has reports whether d is in s, comparing it with every member.
func (s Set) Has(d Digest) bool {
	found := 0
	for _, t := range s {
		found |= subtle.ConstantTimeCompare(d[:], t[:])
	}
	return found == 1
}
