package testsvc

import (
	"crypto/rand"
	"encoding/hex"
)

// RandomHex is n random bytes in hex (2n characters): the part of a key
// prefix, a subject prefix or a token that keeps one test's names apart
// from every other run's.
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
