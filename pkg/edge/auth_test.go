package edge

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

const secretText = "s3cr3t-t0ken-value"

func TestSecretIsRedactedInFormatting(t *testing.T) {
	s := secret.Secret(secretText)
	//lint:ignore S1025 the test is of the %s verb, not of String
	viaS := fmt.Sprintf("%s", s) //nolint:staticcheck // as above
	for name, got := range map[string]string{
		"%v":           fmt.Sprintf("%v", s),
		"%s":           viaS,
		"%+v":          fmt.Sprintf("%+v", s),
		"Sprint":       fmt.Sprint(s),
		"Sprintln":     fmt.Sprintln(s),
		"String":       s.String(),
		"%v of struct": fmt.Sprintf("%v", AuthConfig{Token: s, DeliverTokens: []secret.Secret{s}, ExtraTokens: map[string]secret.Secret{"tel-1": s}}),
		"%+v of ptr":   fmt.Sprintf("%+v", &AuthConfig{Token: s}),
	} {
		if strings.Contains(got, secretText) {
			t.Errorf("%s leaks the token: %q", name, got)
		}
		if !strings.Contains(got, "[redacted]") {
			t.Errorf("%s = %q, want it to say [redacted]", name, got)
		}
	}
	if got := fmt.Sprintf("%v", s); got != "[redacted]" {
		t.Errorf("%%v = %q, want [redacted]", got)
	}
	// The value itself is intact: only its printing is redacted.
	if string(s) != secretText {
		t.Errorf("string(Secret) = %q", string(s))
	}
}

func TestSecretIsRedactedInLogs(t *testing.T) {
	s := secret.Secret(secretText)
	handlers := map[string]func(*bytes.Buffer) slog.Handler{
		"json": func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		"text": func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	}
	for name, h := range handlers {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(h(&buf))
			log.Info("hello", "token", s)
			log.Info("attr", slog.Any("token", s))
			log.Info("group", slog.Group("auth", "token", s))
			log.With("token", s).Info("with")
			log.WithGroup("g").Info("in group", "token", s)
			out := buf.String()
			if strings.Contains(out, secretText) {
				t.Fatalf("log output leaks the token:\n%s", out)
			}
			if n := strings.Count(out, "[redacted]"); n != 5 {
				t.Fatalf("[redacted] appears %d times, want 5:\n%s", n, out)
			}
		})
	}
}

func TestParseExtraTokens(t *testing.T) {
	got, err := ParseExtraTokens("a=1, b=2")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]secret.Secret{"a": "1", "b": "2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	got, err = ParseExtraTokens(" tel-1 = tok=with=equals ,,")
	if err != nil {
		t.Fatal(err)
	}
	if got["tel-1"] != "tok=with=equals" || len(got) != 1 {
		t.Fatalf("a token may contain '=' (cut at the first): %v", map[string]string{"tel-1": string(got["tel-1"])})
	}
	for _, empty := range []string{"", " ", ",", " , "} {
		got, err := ParseExtraTokens(empty)
		if err != nil || len(got) != 0 {
			t.Errorf("ParseExtraTokens(%q) = %v, %v; want empty, nil", empty, got, err)
		}
	}
	for _, bad := range []string{"a", "=x", "a=", "a=1,b", "a=1, =2", " = "} {
		if got, err := ParseExtraTokens(bad); err == nil {
			t.Errorf("ParseExtraTokens(%q) = %v, want an error", bad, got)
		} else if !strings.Contains(err.Error(), "MOBILE_EXTRA_TOKENS") {
			t.Errorf("ParseExtraTokens(%q) error %q does not name the variable", bad, err)
		}
	}
	// An error names the entry, not the token of a well-formed one.
	if _, err := ParseExtraTokens("ok=" + secretText + ",broken"); err == nil || strings.Contains(err.Error(), secretText) {
		t.Errorf("error %v should not show another entry's token", err)
	}
}

func TestParsePrefixes(t *testing.T) {
	for in, want := range map[string][]string{
		"":                         nil,
		"10.0.0.0/8":               {"10.0.0.0/8"},
		"10.1.2.3/8":               {"10.0.0.0/8"}, // masked
		"192.168.1.5":              {"192.168.1.5/32"},
		"::1":                      {"::1/128"},
		"2001:db8::/32":            {"2001:db8::/32"},
		"::ffff:10.0.0.1":          {"10.0.0.1/32"}, // an IPv4-mapped address is IPv4
		"::ffff:10.0.0.0/104":      {"10.0.0.0/8"},  // and so is an IPv4-mapped CIDR
		"::ffff:10.1.2.3/128":      {"10.1.2.3/32"},
		"::ffff:0.0.0.0/96":        {"0.0.0.0/0"},
		" 10.0.0.0/8 , 127.0.0.1 ": {"10.0.0.0/8", "127.0.0.1/32"},
		"127.0.0.1,,::1":           {"127.0.0.1/32", "::1/128"},
	} {
		got, err := ParsePrefixes(in)
		if err != nil {
			t.Errorf("ParsePrefixes(%q): %v", in, err)
			continue
		}
		var gs []string
		for _, p := range got {
			gs = append(gs, p.String())
		}
		if !reflect.DeepEqual(gs, want) {
			t.Errorf("ParsePrefixes(%q) = %v, want %v", in, gs, want)
		}
	}
	for _, bad := range []string{"bad", "10.0.0.0/33", "1.2.3.4/", "10.0.0.0/8,nope", "300.1.1.1", "::1/129", "example.com"} {
		if got, err := ParsePrefixes(bad); err == nil {
			t.Errorf("ParsePrefixes(%q) = %v, want an error", bad, got)
		} else if !strings.Contains(err.Error(), "MOBILE_TRUSTED_PROXIES") {
			t.Errorf("ParsePrefixes(%q) error %q does not name the variable", bad, err)
		}
	}
	// A bare address covers exactly itself.
	ps, _ := ParsePrefixes("192.168.1.5")
	if !ps[0].Contains(netip.MustParseAddr("192.168.1.5")) || ps[0].Contains(netip.MustParseAddr("192.168.1.6")) {
		t.Errorf("%v should cover exactly 192.168.1.5", ps[0])
	}
}

func testAuth() *authenticator {
	return newAuthenticator(AuthConfig{
		Token:         "main-token",
		ExtraTokens:   map[string]secret.Secret{"tel-1": "bound-1", "tel-2": "bound-2"},
		DeliverTokens: []secret.Secret{"deliver-1", "deliver-2"},
	})
}

func TestAuthenticatorCheck(t *testing.T) {
	a := testAuth()
	for _, tc := range []struct {
		token                   string
		valid, deliver, general bool
	}{
		{"main-token", true, false, true},
		{"bound-1", true, false, false},
		{"bound-2", true, false, false},
		{"deliver-1", true, true, true},
		{"deliver-2", true, true, true},
		{"wrong", false, false, false},
		{"main-token ", false, false, false},
		{"MAIN-TOKEN", false, false, false},
		{"main-toke", false, false, false},
		{"", false, false, false},
		{"tel-1", false, false, false}, // a device id is not its token
	} {
		g := a.check(tc.token)
		if g.valid != tc.valid || g.deliver != tc.deliver || g.general != tc.general {
			t.Errorf("check(%q) = valid %v deliver %v general %v; want %v %v %v",
				tc.token, g.valid, g.deliver, g.general, tc.valid, tc.deliver, tc.general)
		}
	}
}

func TestAuthenticatorWithoutMainToken(t *testing.T) {
	// No app token configured: the empty token must not match it.
	a := newAuthenticator(AuthConfig{ExtraTokens: map[string]secret.Secret{"tel-1": "bound-1"}})
	if g := a.check(""); g.valid {
		t.Fatalf("empty token accepted with no app token configured: %+v", g)
	}
	if g := a.check("bound-1"); !g.valid || g.general {
		t.Fatalf("bound token: %+v", g)
	}
	none := newAuthenticator(AuthConfig{})
	for _, tok := range []string{"", "x"} {
		if g := none.check(tok); g.valid {
			t.Fatalf("no tokens configured, yet %q is valid", tok)
		}
	}
}

func TestBindingOK(t *testing.T) {
	a := testAuth()
	for _, tc := range []struct {
		token, device string
		ok            bool
	}{
		{"bound-1", "tel-1", true},     // a bound device with its token
		{"main-token", "tel-1", false}, // a bound device needs its own token
		{"deliver-1", "tel-1", false},  // even a deliver token cannot take it
		{"bound-2", "tel-1", false},    // nor another device's token
		{"bound-1", "tel-3", false},    // a bound token cannot take another device
		{"bound-1", "tel-2", false},
		{"main-token", "tel-3", true}, // the app token takes unbound devices
		{"deliver-1", "cron", true},   // so does a deliver token
	} {
		if got := a.bindingOK(a.check(tc.token), tc.device); got != tc.ok {
			t.Errorf("bindingOK(%q, %q) = %v, want %v", tc.token, tc.device, got, tc.ok)
		}
	}
}

func TestAllowedDevice(t *testing.T) {
	open := newAuthenticator(AuthConfig{Token: "t"})
	for _, d := range []string{"tel-1", "anything", ""} {
		if !open.allowedDevice(grant{}, d) {
			t.Errorf("no allow-list, yet %q is refused", d)
		}
	}
	closed := newAuthenticator(AuthConfig{Token: "t", AllowedDevices: []string{"tel-1", "tel-2"}})
	for d, want := range map[string]bool{"tel-1": true, "tel-2": true, "tel-3": false, "": false, "TEL-1": false, "tel-1 ": false} {
		if got := closed.allowedDevice(grant{}, d); got != want {
			t.Errorf("allowedDevice(%q) = %v, want %v", d, got, want)
		}
	}
}

// openTenants writes content as a tenants file and opens it.
func openTenants(t *testing.T, content string) *tenant.Registry {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := tenant.Open(tenant.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestOwnerKeysAdmitTheirOwnersDevices(t *testing.T) {
	reg := openTenants(t, `tenants:
  - id: acme
    keys:
      - {id: app, kind: app, secret: a}
      - {id: ann, kind: device, device: tel-9, secret: b}
      - {id: hermes, kind: agent, secret: c}
      - {id: cron, kind: deliver, secret: d}
`)
	a := newAuthenticator(AuthConfig{Token: "legacy-token", Tenants: reg, AllowedDevices: []string{"tel-1"}})
	for _, c := range []struct {
		token, device string
		valid, bound  bool
		owner, kind   string
		deliver       bool
	}{
		{"hmt_acme.app.a", "tel-1", true, true, "acme", "app", false},
		{"hmt_acme.app.a", "any-other", true, true, "acme", "app", false}, // MOBILE_ALLOWED_DEVICES is the legacy owner's
		{"hmt_acme.app.a", "tel-9", true, false, "acme", "app", false},    // bound by ann's device key
		{"hmt_acme.ann.b", "tel-9", true, true, "acme", "device", false},
		{"hmt_acme.ann.b", "tel-1", true, false, "acme", "device", false},
		{"hmt_acme.cron.d", "cron-1", true, true, "acme", "deliver", true},
		{"hmt_acme.hermes.c", "tel-1", false, false, "", "", false}, // an agent's key is no phone's
		{"hmt_acme.app.x", "tel-1", false, false, "", "", false},
		{"hmt_other.app.a", "tel-1", false, false, "", "", false},
		{"legacy-token", "tel-1", true, true, tenant.Legacy, "app", false},
	} {
		g := a.check(c.token)
		if g.valid != c.valid {
			t.Errorf("%s: valid = %v, want %v", c.token, g.valid, c.valid)
			continue
		}
		if !g.valid {
			continue
		}
		ok := a.allowedDevice(g, c.device) && a.bindingOK(g, c.device)
		if ok != c.bound || g.owner() != c.owner || a.kind(g, c.device) != c.kind || g.deliver != c.deliver {
			t.Errorf("%s as %s: admitted %v owner %q kind %q deliver %v; want %v %q %q %v", c.token, c.device,
				ok, g.owner(), a.kind(g, c.device), g.deliver, c.bound, c.owner, c.kind, c.deliver)
		}
	}
	// Without the file an hmt_ credential is only a token like any other.
	plain := newAuthenticator(AuthConfig{Token: "legacy-token"})
	if plain.check("hmt_acme.app.a").valid {
		t.Error("an owner key was taken without a tenants file")
	}
}
