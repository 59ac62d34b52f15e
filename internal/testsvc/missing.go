package testsvc

import (
	"os"
	"testing"
)

// Missing stops t for a part of the machine it needs that is not there
// (msg says which, and how to get it): a skip on a developer's machine, a
// failure in CI (CI set), where every part must be.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
