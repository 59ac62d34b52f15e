package edge

import (
	"net/netip"
	"testing"
)

func proxyServer(prefixes ...string) *Server {
	s := &Server{}
	for _, p := range prefixes {
		s.cfg.Auth.TrustedProxies = append(s.cfg.Auth.TrustedProxies, netip.MustParsePrefix(p))
	}
	return s
}

func TestTrustedProxy(t *testing.T) {
	s := proxyServer("10.0.0.0/8", "::1/128")
	for a, want := range map[string]bool{
		"10.0.0.1":    true,
		"10.255.1.2":  true,
		"11.0.0.1":    false,
		"::1":         true,
		"127.0.0.1":   false,
		"2001:db8::1": false,
	} {
		if got := s.trustedProxy(netip.MustParseAddr(a)); got != want {
			t.Errorf("trustedProxy(%s) = %v, want %v", a, got, want)
		}
	}
	if proxyServer().trustedProxy(netip.MustParseAddr("127.0.0.1")) {
		t.Error("no proxies configured, yet 127.0.0.1 is trusted")
	}
}

func TestClientFromHeaders(t *testing.T) {
	s := proxyServer("10.0.0.0/8", "127.0.0.0/8", "fd00::/8")
	for _, tc := range []struct {
		name, xff, fwd, want string // want "" is the zero Addr: unknown
	}{
		{"no headers", "", "", ""},
		{"client behind one proxy", "203.0.113.9, 10.0.0.1", "", "203.0.113.9"},
		{"single hop", "203.0.113.9", "", "203.0.113.9"},
		{"no spaces", "203.0.113.9,10.0.0.1,10.0.0.2", "", "203.0.113.9"},
		{"rightmost untrusted wins over a spoofed left", "198.51.100.1, 203.0.113.9, 10.0.0.1", "", "203.0.113.9"},
		{"spoofed loopback on the left", "127.0.0.1, 203.0.113.9", "", "203.0.113.9"},
		{"all hops trusted", "10.0.0.2, 10.0.0.1", "", ""},
		{"only a trusted loopback hop", "127.0.0.1", "", ""},
		{"garbage hop", "203.0.113.9, garbage", "", ""},
		{"garbage between", "203.0.113.9, nope, 10.0.0.1", "", ""},
		{"garbage left of the client is never read", "garbage, 203.0.113.9", "", "203.0.113.9"},
		{"empty hop", "203.0.113.9, , 10.0.0.1", "", ""},
		{"unknown", "unknown", "", ""},
		{"ipv4 with port", "203.0.113.9:5555", "", "203.0.113.9"},
		{"ipv6 bracketed with port", "[2001:db8::1]:443", "", "2001:db8::1"},
		{"ipv6 bare", "2001:db8::1, 10.0.0.1", "", "2001:db8::1"},
		{"ipv6 trusted proxy", "2001:db8::1, fd00::5", "", "2001:db8::1"},
		{"ipv4-mapped", "::ffff:203.0.113.9", "", "203.0.113.9"},
		{"ipv4-mapped trusted", "203.0.113.9, ::ffff:10.0.0.1", "", "203.0.113.9"},
		{"loopback client (not a proxy here)", "::1", "", "::1"},

		{"forwarded quoted", "", `for="203.0.113.9"`, "203.0.113.9"},
		{"forwarded bare", "", `for=203.0.113.9`, "203.0.113.9"},
		{"forwarded case and params", "", `For=192.0.2.60;proto=http;by=203.0.113.43`, "192.0.2.60"},
		{"forwarded param order", "", `proto=https; for="192.0.2.60:4711"; host=example.com`, "192.0.2.60"},
		{"forwarded ipv6", "", `for="[2001:db8:cafe::17]:4711"`, "2001:db8:cafe::17"},
		{"forwarded elements", "", `for=192.0.2.43, for="[2001:db8:cafe::17]"`, "2001:db8:cafe::17"},
		{"forwarded elements, last trusted", "", `for=203.0.113.9, for=10.0.0.1`, "203.0.113.9"},
		{"forwarded all trusted", "", `for=10.0.0.9;proto=http, for="10.0.0.1"`, ""},
		{"forwarded obfuscated", "", `for=_hidden, for=10.0.0.1`, ""},
		{"forwarded unknown", "", `for=unknown`, ""},
		{"forwarded without for", "", `proto=https;host=example.com`, ""},
	} {
		// A case with a Forwarded value runs with MOBILE_FORWARDED_HEADER=forwarded.
		h := tc.xff
		s.cfg.Auth.ForwardedHeader = HeaderXForwardedFor
		if tc.fwd != "" {
			s.cfg.Auth.ForwardedHeader, h = HeaderForwarded, tc.fwd
		}
		got := s.clientFromHeaders(h)
		if tc.want == "" {
			if got.IsValid() {
				t.Errorf("%s: XFF %q Forwarded %q → %v, want unknown", tc.name, tc.xff, tc.fwd, got)
			}
			continue
		}
		if got != netip.MustParseAddr(tc.want) {
			t.Errorf("%s: XFF %q Forwarded %q → %v, want %s", tc.name, tc.xff, tc.fwd, got, tc.want)
		}
	}
}

// An unknown client is never loopback, so it never gets deliver for free.
func TestUnknownClientIsNotLoopback(t *testing.T) {
	s := proxyServer("127.0.0.0/8")
	for _, xff := range []string{"", "127.0.0.1", "garbage", "127.0.0.1, garbage"} {
		if a := s.clientFromHeaders(xff); a.IsLoopback() {
			t.Errorf("XFF %q → %v, which counts as loopback", xff, a)
		}
	}
}

func TestForwardedFor(t *testing.T) {
	got := forwardedFor(`for=192.0.2.43;proto=http, FOR="[2001:db8::1]:80";by=x, proto=https`)
	want := []string{"192.0.2.43", `"[2001:db8::1]:80"`}
	if len(got) != len(want) {
		t.Fatalf("forwardedFor = %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("forwardedFor = %q, want %q", got, want)
		}
	}
}

func TestParseHop(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.3.4":             "1.2.3.4",
		"1.2.3.4:56":          "1.2.3.4",
		" 1.2.3.4 ":           "1.2.3.4",
		`"1.2.3.4"`:           "1.2.3.4",
		` "1.2.3.4:80" `:      "1.2.3.4",
		"::1":                 "::1",
		"[::1]":               "::1",
		"[::1]:56":            "::1",
		`"[::1]"`:             "::1",
		`"[2001:db8::1]:443"`: "2001:db8::1",
		"2001:db8::1":         "2001:db8::1",
		"::ffff:1.2.3.4":      "1.2.3.4",
		"[::ffff:1.2.3.4]:80": "1.2.3.4",
	} {
		a, ok := parseHop(in)
		if !ok || a != netip.MustParseAddr(want) {
			t.Errorf("parseHop(%q) = %v, %v; want %s", in, a, ok, want)
		}
	}
	for _, in := range []string{"", " ", `""`, "unknown", "_hidden", "garbage", "1.2.3.4:", "1.2.3", "300.1.1.1", "example.com:80", "1.2.3.4:99999"} {
		if a, ok := parseHop(in); ok {
			t.Errorf("parseHop(%q) = %v, want failure", in, a)
		}
	}
}
