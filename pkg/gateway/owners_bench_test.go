package gateway_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// benchOwnerSecret is the secret of the app key of owner "bench", the
// owner whose phone says hello in BenchmarkHelloOwners.
const benchOwnerSecret = "bench-app-secret"

// BenchmarkHelloOwners measures hello→ready of a phone with a file
// owner's app key on a node whose tenants file holds that one owner, and
// on one whose file holds it among 10,000 owners (each with an app key,
// a device key and an agent key): the key is found by its public part in
// a map, so the cost must not grow with the file (docs/performance.md,
// "Hello with 10,000 owners": within 5 %). Both nodes run side by side,
// each fresh, with the same work otherwise. Each op dials a WebSocket,
// says hello as a new device id and reads ready (ns/op, a mean);
// hello-µs is the median of the hello→ready part alone.
//
// -count repeats each sub-benchmark in place, one after the other, so on
// a shared machine whose load moves from second to second the two can
// differ by what the machine did meanwhile. "alternating" therefore
// says hello to the two nodes in turns, op by op, and reports each
// one's hello-µs and their ratio (10,000 owners over 1): the load moves
// both alike (medians). Run:
//
//	go test -run '^$' -bench HelloOwners -count 6 ./pkg/gateway
func BenchmarkHelloOwners(b *testing.B) {
	one, many := startOwnersNode(b, 1), startOwnersNode(b, 10000)
	b.Run("owners=1", func(b *testing.B) { benchHello(b, one) })
	b.Run("owners=10000", func(b *testing.B) { benchHello(b, many) })
	b.Run("alternating", func(b *testing.B) {
		var t1, t2 []time.Duration
		i := 0
		for b.Loop() {
			if i%2 == 0 {
				t1 = append(t1, helloOnce(b, one, i))
			} else {
				t2 = append(t2, helloOnce(b, many, i))
			}
			i++
		}
		if len(t2) > 0 {
			m1, m2 := median(t1), median(t2)
			b.ReportMetric(float64(m1)/1e3, "hello-µs-1")
			b.ReportMetric(float64(m2)/1e3, "hello-µs-10000")
			b.ReportMetric(float64(m2)/float64(m1), "ratio")
		}
	})
}

// ownersNode is a node of startOwnersNode and how many owners its file
// holds.
type ownersNode struct {
	*gateway.Gateway
	owners int
}

// benchHello is hello→ready on n, once per op.
func benchHello(b *testing.B, n ownersNode) {
	var ts []time.Duration
	i := 0
	for b.Loop() {
		ts = append(ts, helloOnce(b, n, i))
		i++
	}
	b.ReportMetric(float64(median(ts))/1e3, "hello-µs")
}

// median is the middle of ts (sorted in place): a stall of the shared
// machine moves a mean, not the median.
func median(ts []time.Duration) time.Duration {
	slices.Sort(ts)
	return ts[len(ts)/2]
}

// helloOnce dials n, says hello with the bench owner's app key as device
// phone-<i> and returns how long hello→ready took.
func helloOnce(b *testing.B, n ownersNode, i int) time.Duration {
	ctx := context.Background()
	c, err := client.Dial(ctx, n.URL(), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseNow()
	start := time.Now()
	if _, err := c.Hello(ctx, tenant.Credential("bench", "app", benchOwnerSecret), protocol.Device{ID: fmt.Sprintf("phone-%d", i)}, protocol.User{}); err != nil {
		b.Fatalf("hello with the bench owner's key among %d owners: %v", n.owners, err)
	}
	return time.Since(start)
}

// startOwnersNode starts a single node (memory store, in-process bus,
// the demo agent, no log) whose tenants file holds owners owners, the
// last of them "bench".
func startOwnersNode(b *testing.B, owners int) ownersNode {
	b.Helper()
	path := filepath.Join(b.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte(ownersFile(owners)), 0o600); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	reg, err := tenant.Open(tenant.Options{Path: path})
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	if got := len(reg.Snapshot().Tenants); got != owners {
		b.Fatalf("the file holds %d owners, want %d", got, owners)
	}
	if fi, err := os.Stat(path); err == nil {
		b.Logf("a tenants file of %d owners: %d bytes, read and checked in %v", owners, fi.Size(), took.Round(time.Microsecond))
	}
	g, err := gateway.Start(context.Background(), gateway.Config{
		Listen:      "127.0.0.1:0",
		Router:      true,
		Agent:       agent.Demo{},
		Edge:        edge.Config{Auth: edge.AuthConfig{Token: testToken}},
		TenantsFile: path,
	}, nil)
	if err != nil {
		b.Fatalf("start a node with %d owners: %v", owners, err)
	}
	b.Cleanup(func() { g.Close() })
	return ownersNode{g, owners}
}

// ownersFile is a tenants file of n owners, o-1 … o-(n-1) and bench,
// each with an app, a device and an agent key given by their hashes.
func ownersFile(n int) string {
	var f strings.Builder
	f.WriteString("tenants:\n")
	for i := 1; i <= n; i++ {
		id, sec := fmt.Sprintf("o-%d", i), fmt.Sprintf("secret-%d", i)
		if i == n {
			id, sec = "bench", benchOwnerSecret
		}
		fmt.Fprintf(&f, "  - id: %s\n    keys:\n", id)
		fmt.Fprintf(&f, "      - {id: app, kind: app, secret_sha256: %q}\n", tenant.SecretSHA256(sec))
		fmt.Fprintf(&f, "      - {id: tel, kind: device, device: tel-1, secret_sha256: %q}\n", tenant.SecretSHA256(sec+"-tel"))
		fmt.Fprintf(&f, "      - {id: hermes, kind: agent, secret_sha256: %q}\n", tenant.SecretSHA256(sec+"-agent"))
	}
	return f.String()
}
