// Package structure holds the packages of pkg/ and internal/ to their
// layers: a package imports only packages of layers below its own, so the
// tree has no cycle and no arrow running back up (a delivery's fate is
// pkg/dispatch's, below the edge and the router that call it; the gateway
// assembles them; nothing below imports what sits above).
package structure

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/hermes-mobile/gateway/"

// layer is every package's place, lowest first. A new package must be
// given one here: the test refuses a package it does not know.
var layer = map[string]int{
	// Contracts and leaves: import nothing of ours but each other's
	// lower ones.
	"pkg/protocol": 0, "pkg/ids": 0, "pkg/clock": 0, "pkg/secret": 0, "pkg/tokens": 0, "pkg/web": 0,
	"pkg/bus": 0, "pkg/store": 0, "pkg/push/pushtest": 0,
	"internal/batch": 0, "internal/retry": 0, "internal/fakellm": 0,
	"pkg/config": 1, "pkg/wire": 1, "pkg/telemetry": 1, "pkg/client": 1, "pkg/tenant": 1,
	// Implementations of the contracts, and what needs only them.
	"pkg/push": 2, "pkg/bus/natsbus": 2, "pkg/store/memstore": 2, "pkg/store/redisstore": 2,
	"pkg/admin": 2, "pkg/agent": 2, "pkg/usage": 2,
	// A delivery's fate.
	"pkg/dispatch": 3,
	// The two roles, side by side: neither imports the other.
	"pkg/edge": 4, "pkg/router": 4,
	// A node.
	"pkg/gateway": 5,
	// Test helpers and suites, imported by tests only.
	"internal/testsvc": 6, "pkg/store/storetest": 7, "pkg/bus/bustest": 7,
}

// testOnly are the packages no package outside tests and suites may import.
var testOnly = map[string]bool{"internal/testsvc": true, "pkg/store/storetest": true, "pkg/bus/bustest": true}

func TestPackagesImportOnlyLayersBelow(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./pkg/...", "./internal/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		own, ok := layer[pkg]
		if !ok {
			t.Errorf("%s has no layer: give it one in structure_test.go", pkg)
			continue
		}
		seen++
		for _, imp := range fields[1:] {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			switch l, ok := layer[dep]; {
			case !ok:
				t.Errorf("%s imports %s, which has no layer", pkg, dep)
			case testOnly[dep] && !testOnly[pkg]:
				t.Errorf("%s imports the test helper %s", pkg, dep)
			case l >= own:
				t.Errorf("%s (layer %d) imports %s (layer %d): an arrow running sideways or back up", pkg, own, dep, l)
			}
		}
	}
	if seen < len(layer) {
		t.Errorf("go list named %d of the %d packages given a layer: a package was removed or renamed", seen, len(layer))
	}
}
