package push_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/push"
)

// TestPolicyCheckAddr: what each policy lets a request reach, at the
// edges of each range.
func TestPolicyCheckAddr(t *testing.T) {
	def := push.Policy{}
	private := push.Policy{AllowPrivate: true}
	lan := push.Policy{AllowNets: mustNets(t, "192.168.1.0/24, 169.254.0.0/16, ::ffff:127.0.0.0/104")}
	for _, tc := range []struct {
		addr              string
		def, private, lan bool // allowed under each
	}{
		{"93.184.215.14", true, true, true},
		{"2606:4700::6810:84e5", true, true, true},
		{"127.0.0.1", false, false, true},
		{"127.255.255.255", false, false, true},
		{"::1", false, false, false},
		{"::ffff:127.0.0.1", false, false, true},
		{"::ffff:7f00:1", false, false, true},
		{"0.0.0.0", false, false, false},
		{"0.255.255.255", false, false, false},
		{"1.0.0.0", true, true, true},
		{"::", false, false, false},
		{"169.254.0.1", false, false, true},
		{"169.254.169.254", false, false, false}, // metadata: never, even when its network is allowed
		{"169.254.170.2", false, false, false},
		{"fd00:ec2::254", false, false, false},
		{"100.100.100.200", false, false, false},
		{"fe80::1", false, false, false},
		{"fe80::1%eth0", false, false, false},
		{"224.0.0.1", false, false, false},
		{"239.255.255.255", false, false, false},
		{"ff02::1", false, false, false},
		{"240.0.0.1", false, false, false},
		{"255.255.255.255", false, false, false},
		{"9.255.255.255", true, true, true},
		{"10.0.0.0", false, true, false},
		{"10.255.255.255", false, true, false},
		{"11.0.0.0", true, true, true},
		{"172.15.255.255", true, true, true},
		{"172.16.0.0", false, true, false},
		{"172.31.255.255", false, true, false},
		{"172.32.0.0", true, true, true},
		{"192.167.255.255", true, true, true},
		{"192.168.0.1", false, true, false},
		{"192.168.1.1", false, true, true},
		{"192.168.255.255", false, true, false},
		{"192.169.0.0", true, true, true},
		{"100.63.255.255", true, true, true},
		{"100.64.0.0", false, true, false},
		{"100.127.255.255", false, true, false},
		{"100.128.0.0", true, true, true},
		{"fc00::1", false, true, false},
		{"fdff:ffff::1", false, true, false},
		{"fec0::1", false, true, false},
		{"64:ff9b::7f00:1", false, false, true},     // NAT64 of 127.0.0.1
		{"64:ff9b::a9fe:a9fe", false, false, false}, // NAT64 of 169.254.169.254
		{"64:ff9b::5db8:d70e", true, true, true},    // NAT64 of a public address
		{"2002:7f00:1::1", false, false, true},      // 6to4 of 127.0.0.1
		{"::127.0.0.1", false, false, false},        // IPv4-compatible: reserved
	} {
		a := netip.MustParseAddr(tc.addr)
		for _, p := range []struct {
			name   string
			policy push.Policy
			want   bool
		}{{"default", def, tc.def}, {"private allowed", private, tc.private}, {"LAN allowed", lan, tc.lan}} {
			err := p.policy.CheckAddr(a)
			var re *push.RefusedError
			if (err == nil) != p.want || (err != nil && !errors.As(err, &re)) {
				t.Errorf("%s, %s: CheckAddr = %v, want allowed %v", tc.addr, p.name, err, p.want)
			}
		}
	}
}

// TestPolicyCheckHost: registration sees through every way of writing an
// address (decimal, octal, hex, shortened, bracketed IPv6, a trailing
// dot, localhost's names) and refuses a numeric host not written dotted
// decimal, even a public one; names pass (checked when dialed).
func TestPolicyCheckHost(t *testing.T) {
	var p push.Policy
	for _, tc := range []struct {
		host string
		want string // in the error; "" for allowed
	}{
		{"ntfy.sh", ""},
		{"push.example.com.", ""},
		{"8.8.8.8", ""},
		{"2606:4700::1", ""},
		{"2130706433", "127.0.0.1 is a loopback address"},
		{"0x7f000001", "127.0.0.1 is a loopback address"},
		{"0x7F.1", "127.0.0.1 is a loopback address"},
		{"017700000001", "127.0.0.1 is a loopback address"},
		{"0177.0.0.1", "127.0.0.1 is a loopback address"},
		{"127.1", "127.0.0.1 is a loopback address"},
		{"127.0.0.1.", "127.0.0.1 is a loopback address"},
		{"127.000.000.001", "127.0.0.1 is a loopback address"},
		{"2852039166", "169.254.169.254 is a cloud metadata address"},
		{"0xa9.0xfe.0xa9.0xfe", "169.254.169.254 is a cloud metadata address"},
		{"169.254.169.254", "cloud metadata"},
		{"::ffff:169.254.169.254", "cloud metadata"},
		{"fd00:ec2::254", "cloud metadata"},
		{"0", "0.0.0.0 is an unspecified address"},
		{"0.0.0.0", "unspecified"},
		{"10.1.2.3", "private address"},
		{"167772161", "10.0.0.1 is a private address"},
		{"134744072", "write it 8.8.8.8"},
		{"localhost", "loopback"},
		{"LOCALHOST.", "loopback"},
		{"app.localhost", "loopback"},
		{"fe80::1%eth0", "link-local"},
		{"4294967296", ""}, // past 32 bits: a name, no address
		{"1.2.3.4.5", ""},
		{"08.1.2.3", ""}, // not octal: a name
	} {
		err := p.CheckHost(tc.host)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckHost(%q) = %v, want %q", tc.host, err, tc.want)
		}
	}
	// Allowed networks let the address through, in whatever form.
	lan := push.Policy{AllowPrivate: true}
	if err := lan.CheckHost("10.1.2.3"); err != nil {
		t.Errorf("with private addresses allowed: %v", err)
	}
	if err := lan.CheckHost("2130706433"); err == nil {
		t.Error("with private addresses allowed, loopback passed")
	}
}

// TestParseNets: networks and single addresses, an IPv4-mapped network
// as the IPv4 one; anything else is an error naming it.
func TestParseNets(t *testing.T) {
	nets := mustNets(t, " 192.168.1.0/24 ,fd12::/64,10.0.0.7,, ::ffff:10.1.0.0/112")
	want := []string{"192.168.1.0/24", "fd12::/64", "10.0.0.7/32", "10.1.0.0/16"}
	if len(nets) != len(want) {
		t.Fatalf("nets %v, want %v", nets, want)
	}
	for i := range want {
		if nets[i].String() != want[i] {
			t.Fatalf("nets %v, want %v", nets, want)
		}
	}
	for _, bad := range []string{"192.168.1.0/33", "lan", "10.0.0.0/8,example.com"} {
		if _, err := push.ParseNets(bad); err == nil {
			t.Errorf("ParseNets(%q) took it", bad)
		}
	}
	if nets, err := push.ParseNets(""); err != nil || len(nets) != 0 {
		t.Errorf("ParseNets(\"\") = %v, %v; want none", nets, err)
	}
}

func mustNets(t *testing.T, s string) []netip.Prefix {
	t.Helper()
	nets, err := push.ParseNets(s)
	if err != nil {
		t.Fatal(err)
	}
	return nets
}
