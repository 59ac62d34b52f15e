package tenant_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

const goodFile = `tenants:
  - id: acme
    keys:
      - {id: app1, kind: app, secret_sha256: "%APP%"}
      - {id: ann, kind: device, device: tel-1, secret: "ann-secret"}
      - {id: hermes, kind: agent, secret: "agent-secret"}
      - {id: cron, kind: deliver, secret: "cron-secret"}
    quota: {outbox_mib: 16}
  - id: beta-2
    keys:
      - {id: app1, kind: app, secret: "beta-app"}
`

func good() string {
	return strings.Replace(goodFile, "%APP%", tenant.SecretSHA256("acme-app"), 1)
}

func TestParseAndVerify(t *testing.T) {
	s, err := tenant.Parse("t.yaml", []byte(good()))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cred        string
		owner, kind string
		ok          bool
	}{
		{tenant.Credential("acme", "app1", "acme-app"), "acme", "app", true},
		{tenant.Credential("acme", "ann", "ann-secret"), "acme", "device", true},
		{tenant.Credential("acme", "hermes", "agent-secret"), "acme", "agent", true},
		{tenant.Credential("acme", "cron", "cron-secret"), "acme", "deliver", true},
		{tenant.Credential("beta-2", "app1", "beta-app"), "beta-2", "app", true},
		// Another owner's secret under this owner's key id.
		{tenant.Credential("acme", "app1", "beta-app"), "", "", false},
		{tenant.Credential("beta-2", "app1", "acme-app"), "", "", false},
		{tenant.Credential("nobody", "app1", "acme-app"), "", "", false},
		{tenant.Credential("acme", "nokey", "acme-app"), "", "", false},
		{tenant.Credential("acme", "app1", ""), "", "", false},
		{"hmt_acme.app1", "", "", false},
		{"acme.app1.acme-app", "", "", false},
		{"", "", "", false},
	} {
		k, ok := s.Verify(c.cred)
		if ok != c.ok || ok && (k.Owner != c.owner || string(k.Kind) != c.kind) {
			t.Errorf("Verify(%q) = %+v, %v; want owner %q kind %q, %v", c.cred, k, ok, c.owner, c.kind, c.ok)
		}
	}
	// A secret may hold dots: only the first two split the credential.
	s2, err := tenant.Parse("t.yaml", []byte("tenants:\n  - id: a\n    keys: [{id: k, kind: app, secret: \"x.y.z\"}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.Verify("hmt_a.k.x.y.z"); !ok {
		t.Error("a secret with dots was refused")
	}
	want := tenant.DefaultQuota()
	want.OutboxMiB = 16
	if q := s.Tenant("acme").Quota; q != want {
		t.Errorf("acme's quota = %+v, want outbox_mib 16 and the defaults", q)
	}
	s3, err := tenant.Parse("t.yaml", []byte("tenants:\n  - id: a\n    quota: {deliveries_per_second: 1, event_reads: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if q := s3.QuotaOf("a"); q.DeliveriesPerSecond != 1 || q.EventReads != 2 || q.Connections != tenant.DefaultConnections {
		t.Errorf("a's quota = %+v, want deliveries_per_second 1, event_reads 2 and the defaults", q)
	}
	if q := s3.QuotaOf("gone"); q != tenant.DefaultQuota() {
		t.Errorf("an owner the file lacks has the quota %+v, want the defaults", q)
	}
	if !s.Bound("acme", "tel-1") || s.Bound("acme", "tel-2") || s.Bound("beta-2", "tel-1") {
		t.Error("Bound: only acme's tel-1 has a device key")
	}
}

func TestParseJSON(t *testing.T) {
	s, err := tenant.Parse("t.json", []byte(`{"tenants":[{"id":"acme","keys":[{"id":"a","kind":"agent","secret":"s"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Verify("hmt_acme.a.s"); !ok {
		t.Error("the JSON file's key was refused")
	}
}

func TestParseRefusesNamingTheLine(t *testing.T) {
	long := strings.Repeat("a", tenant.MaxIDLen)
	for _, c := range []struct {
		name, file, want string
	}{
		{"unknown top field", "tenants: []\nextra: 1\n", "line 2: the file has an unknown field \"extra\""},
		{"unknown owner field", "tenants:\n  - id: a\n    name: x\n", "line 3: an owner has an unknown field \"name\""},
		{"unknown key field", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: app, secret: s, scope: all}\n", "line 4: a key has an unknown field \"scope\""},
		{"unknown quota field", "tenants:\n  - id: a\n    quota: {outbox: 1}\n", "line 3: quota has an unknown field \"outbox\""},
		{"duplicate owner", "tenants:\n  - id: a\n  - id: b\n  - id: a\n", "line 4: owner \"a\" appears twice"},
		{"duplicate key", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: app, secret: s}\n      - {id: k, kind: agent, secret: t}\n", "line 5: owner \"a\" has the key \"k\" twice"},
		{"duplicate field", "tenants:\n  - id: a\n    id: b\n", "line 3: an owner has the field \"id\" twice"},
		{"bad owner id", "tenants:\n  - id: Acme\n", "line 2: owner id \"Acme\""},
		{"owner id too long", "tenants:\n  - id: " + long + "b\n", "line 2: owner id"},
		{"owner id with a dot", "tenants:\n  - id: a.b\n", "line 2: owner id"},
		{"bad key id", "tenants:\n  - id: a\n    keys:\n      - {id: k_1, kind: app, secret: s}\n", "line 4: key id \"k_1\""},
		{"both secrets", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: app, secret: s, secret_sha256: \"" + tenant.SecretSHA256("s") + "\"}\n", "line 4: key \"k\" has both"},
		{"no secret", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: app}\n", "line 4: key \"k\" needs secret_sha256"},
		{"short hash", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: app, secret_sha256: abcd}\n", "line 4: secret_sha256 of key \"k\" is not 64 hex digits"},
		{"bad kind", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: admin, secret: s}\n", "line 4: kind \"admin\""},
		{"device key without device", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: device, secret: s}\n", "line 4: key \"k\" of kind device needs device"},
		{"app key with device", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: app, device: d, secret: s}\n", "line 4: key \"k\" of kind app has a device"},
		{"device id too long", "tenants:\n  - id: a\n    keys:\n      - {id: k, kind: device, device: " + strings.Repeat("d", protocol.MaxDeviceFieldChars+1) + ", secret: s}\n", "line 4: a device id has at most"},
		{"zero quota", "tenants:\n  - id: a\n    quota: {connections: 0}\n", "line 3: quota connections"},
		{"zero rate", "tenants:\n  - id: a\n    quota: {deliveries_per_second: 0}\n", "line 3: quota deliveries_per_second"},
		{"no tenants", "owners: []\n", "line 1: the file has an unknown field \"owners\""},
		{"empty", "", "the file is empty"},
		{"not yaml", "tenants: [\n", "t.yaml: yaml"},
	} {
		_, err := tenant.Parse("t.yaml", []byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.want)
		}
	}
	// At the boundary: an id of 32 characters and a device id of the
	// protocol's maximum are taken.
	ok := "tenants:\n  - id: " + long + "\n    keys:\n      - {id: " + long + ", kind: device, device: " + strings.Repeat("d", protocol.MaxDeviceFieldChars) + ", secret: s}\n"
	if _, err := tenant.Parse("t.yaml", []byte(ok)); err != nil {
		t.Errorf("ids at their limits: %v", err)
	}
}

func TestParseNeverShowsASecret(t *testing.T) {
	_, err := tenant.Parse("t.yaml", []byte("tenants:\n  - id: a\n    keys:\n      - {id: k, kind: app, secret: hunter2-secret, secret_sha256: \"00\"}\n"))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("err = %v: want an error without the secret", err)
	}
}

func TestDeviceKeys(t *testing.T) {
	if got := tenant.DeviceKey(tenant.Legacy, "tel-1"); got != "tel-1" {
		t.Errorf("the legacy owner's device key is %q, want the device id itself", got)
	}
	a, b := tenant.DeviceKey("acme", "tel-1"), tenant.DeviceKey("beta", "tel-1")
	if a == b || a == "tel-1" {
		t.Errorf("acme's and beta's tel-1 share a key: %q, %q", a, b)
	}
	for _, dev := range []string{"tel-1", "", "x:y", "\uFDD0acme:tel-1", "a\x00b"} {
		for _, owner := range []string{"acme", "a-b", tenant.Legacy} {
			if owner == tenant.Legacy && tenant.CheckLegacyDevice(dev) != nil {
				continue
			}
			o, d := tenant.SplitDeviceKey(tenant.DeviceKey(owner, dev))
			if o != owner || d != dev {
				t.Errorf("SplitDeviceKey(DeviceKey(%q, %q)) = %q, %q", owner, dev, o, d)
			}
		}
	}
	// No legacy id is a file owner's device key: the one that would be is
	// refused.
	if err := tenant.CheckLegacyDevice(a); err == nil {
		t.Errorf("the legacy device id %q (acme's tel-1 key) was accepted", a)
	}
	if err := tenant.CheckLegacyDevice("tel-\uFDD0"); err != nil {
		t.Errorf("a legacy id with U+FDD0 inside was refused: %v", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Written beside and renamed over, as an editor or a Secret does.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestReloadKeepsTheLastGoodFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tenants.yaml")
	writeFile(t, path, good())
	if _, err := tenant.Open(tenant.Options{Path: filepath.Join(dir, "none.yaml")}); err == nil {
		t.Error("Open of a missing file did not fail")
	}
	r, err := tenant.Open(tenant.Options{Path: path, Log: testsvc.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var changes []*tenant.Snapshot
	r.OnChange(func(s *tenant.Snapshot) { changes = append(changes, s) })
	first := r.Snapshot()
	if err := r.Reload(false); err != nil || r.Snapshot() != first || len(changes) != 0 {
		t.Fatalf("an unchanged file: err %v, snapshot replaced %v, %d changes", err, r.Snapshot() != first, len(changes))
	}
	writeFile(t, path, "tenants:\n  - id: acme\n    bogus: 1\n")
	if err := r.Reload(false); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("a bad file: err = %v, want line 3", err)
	}
	if r.Snapshot() != first || len(changes) != 0 {
		t.Fatal("a bad file replaced the good snapshot")
	}
	// A removed key: the next snapshot no longer has it.
	ann, _ := first.Verify(tenant.Credential("acme", "ann", "ann-secret"))
	writeFile(t, path, strings.Replace(good(), `      - {id: ann, kind: device, device: tel-1, secret: "ann-secret"}`+"\n", "", 1))
	if err := r.Reload(false); err != nil {
		t.Fatal(err)
	}
	s := r.Snapshot()
	if len(changes) != 1 || changes[0] != s {
		t.Fatalf("%d changes, want 1 with the new snapshot", len(changes))
	}
	if s.Has(ann) || !first.Has(ann) {
		t.Error("Has: the removed key is still there, or never was")
	}
	if _, ok := s.Verify(tenant.Credential("acme", "ann", "ann-secret")); ok {
		t.Error("the removed key still verifies")
	}
	if _, ok := s.Verify(tenant.Credential("acme", "app1", "acme-app")); !ok {
		t.Error("a kept key no longer verifies")
	}
}

// A Kubernetes Secret mounted as a volume changes by a swap of the
// ..data symlink: the file's own path never changes.
func TestReloadFollowsASymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		if err := os.Mkdir(filepath.Join(dir, v), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "v1", "tenants.yaml"), good())
	writeFile(t, filepath.Join(dir, "v2", "tenants.yaml"), "tenants:\n  - id: other\n")
	if err := os.Symlink("v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tenants.yaml")
	if err := os.Symlink(filepath.Join("..data", "tenants.yaml"), path); err != nil {
		t.Fatal(err)
	}
	r, err := tenant.Open(tenant.Options{Path: path, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Snapshot().Tenant("acme") == nil {
		t.Fatal("v1 has acme")
	}
	ctx := t.Context()
	go r.Run(ctx, nil)
	if err := os.Symlink("v2", filepath.Join(dir, "..tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 5*time.Second, "the poll to take v2", func() bool {
		s := r.Snapshot()
		return s.Tenant("acme") == nil && s.Tenant("other") != nil
	})
}

func TestNilRegistry(t *testing.T) {
	var r *tenant.Registry
	if r.Snapshot() != nil {
		t.Error("a nil registry has a snapshot")
	}
	var s *tenant.Snapshot
	if _, ok := s.Verify(tenant.Credential("acme", "app1", "acme-app")); ok {
		t.Error("a nil snapshot verified a key")
	}
}

// reloads reads hermes_tenants_reloads by result.
func reloads(t *testing.T, rd *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "hermes_tenants_reloads" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				r, _ := dp.Attributes.Value("result")
				out[r.AsString()] = dp.Value
			}
		}
	}
	return out
}

func TestReloadsAreCounted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeFile(t, path, good())
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	r, err := tenant.Open(tenant.Options{Path: path, Meter: mp.Meter("t")})
	if err != nil {
		t.Fatal(err)
	}
	if got := reloads(t, rd); got["ok"] != 0 || got["error"] != 0 || len(got) != 2 {
		t.Fatalf("a fresh registry counts %v, want ok and error at 0", got)
	}
	writeFile(t, path, "tenants: [\n")
	for range 3 { // the same bad content is counted once
		_ = r.Reload(false)
	}
	if got := reloads(t, rd); got["error"] != 1 || got["ok"] != 0 {
		t.Fatalf("after a bad file read three times: %v, want error 1", got)
	}
	_ = r.Reload(true) // SIGHUP asks again
	if got := reloads(t, rd); got["error"] != 2 {
		t.Fatalf("after SIGHUP on the bad file: %v, want error 2", got)
	}
	writeFile(t, path, "tenants: []\n")
	if err := r.Reload(false); err != nil {
		t.Fatal(err)
	}
	if got := reloads(t, rd); got["ok"] != 1 || got["error"] != 2 || r.Snapshot().Tenant("acme") != nil {
		t.Fatalf("after a good file: %v, want ok 1, and no acme", got)
	}
}

// The event log's readers skip decoding an entry that MayHoldOwnerKey
// says names no owner's device: that holds only while the bus's JSON
// writes U+FDD0 unescaped.
func TestMayHoldOwnerKey(t *testing.T) {
	data, err := wire.Marshal(wire.Event{Kind: "text", Device: tenant.DeviceKey("acme", "tel-1"), Session: "mobile:" + tenant.DeviceKey("acme", "tel-1")})
	if err != nil {
		t.Fatal(err)
	}
	if !tenant.MayHoldOwnerKey(data) {
		t.Errorf("%s: an owner's event was taken for a legacy one", data)
	}
	data, _ = wire.Marshal(wire.Event{Kind: "text", Device: "tel-1", Text: "plain"})
	if tenant.MayHoldOwnerKey(data) {
		t.Errorf("%s: a legacy event was taken for an owner's", data)
	}
}
