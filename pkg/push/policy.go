package push

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Policy is which addresses a push request may reach. A registered URL is
// any http(s) URL the agent side hands in, so without a policy the router
// would POST wherever it is told: its own admin port, a cloud's metadata
// service, a database on the LAN. The policy is enforced where it cannot
// be dodged, on every address the dialer connects to after DNS resolved
// the host (so a name that resolves to a public address at registration
// and to 127.0.0.1 later is refused too); registration checks a literal
// address early, for a clear 400.
//
// Always refused: cloud metadata addresses (see Metadata), even when
// AllowNets covers them. Refused unless AllowNets covers them: loopback,
// link-local (169.254/16, fe80::/10), unspecified and "this network"
// (0/8), multicast, reserved (240/4 with the broadcast address, ::/96 and
// 100::/64), and, unless AllowPrivate, private addresses (10/8, 172.16/12,
// 192.168/16, 100.64/10 of carrier-grade NAT, fc00::/7, fec0::/10). An
// IPv4 address inside IPv6 (::ffff:a.b.c.d, NAT64's 64:ff9b::/96, 6to4's
// 2002::/16) is judged by the IPv4 address it carries.
type Policy struct {
	// AllowPrivate lets requests reach private addresses
	// (MOBILE_PUSH_ALLOW_PRIVATE): a self-hosted ntfy or webhook receiver
	// on the LAN.
	AllowPrivate bool
	// AllowNets lets requests reach these networks whatever they are
	// (MOBILE_PUSH_ALLOW_NETS): one LAN's subnet rather than every private
	// range, or loopback for a receiver on the router's own host, as tests
	// run theirs. Metadata addresses stay refused.
	AllowNets []netip.Prefix
}

// Metadata are the cloud metadata and credential services' addresses: a
// request there can hand out the host's cloud credentials. They are
// refused whatever the policy allows.
var Metadata = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack, …
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task credentials
	netip.MustParseAddr("169.254.170.23"),  // AWS EKS Pod Identity
	netip.MustParseAddr("fd00:ec2::254"),   // AWS instance metadata over IPv6
	netip.MustParseAddr("fd00:ec2::23"),    // AWS EKS Pod Identity over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("192.0.0.192"),     // Oracle Cloud Classic
}

var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	reserved4   = netip.MustParsePrefix("240.0.0.0/4") // and 255.255.255.255
	cgnat       = netip.MustParsePrefix("100.64.0.0/10")
	v4compat    = netip.MustParsePrefix("::/96")
	discard6    = netip.MustParsePrefix("100::/64")
	siteLocal6  = netip.MustParsePrefix("fec0::/10")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour   = netip.MustParsePrefix("2002::/16")
)

// RefusedError is an address the Policy refuses, and why.
type RefusedError struct {
	Addr netip.Addr
	Why  string // "a loopback address", …
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s is %s; push endpoints may not reach it", e.Addr, e.Why)
}

// CheckAddr reports whether a request may reach a: nil, or a
// *RefusedError.
func (p Policy) CheckAddr(a netip.Addr) error {
	if !a.IsValid() {
		return &RefusedError{a, "not an address"}
	}
	a = a.WithZone("").Unmap()
	if v4, ok := embeddedIPv4(a); ok {
		var re *RefusedError
		if err := p.CheckAddr(v4); errors.As(err, &re) {
			return &RefusedError{a, "the IPv4 address " + v4.String() + " in IPv6, " + re.Why}
		}
		return nil
	}
	if slices.Contains(Metadata, a) {
		return &RefusedError{a, "a cloud metadata address"}
	}
	for _, n := range p.AllowNets {
		if unmapPrefix(n).Contains(a) {
			return nil
		}
	}
	switch {
	case a.IsUnspecified() || thisNetwork.Contains(a):
		return &RefusedError{a, "an unspecified address"}
	case a.IsLoopback():
		return &RefusedError{a, "a loopback address"}
	case a.IsLinkLocalUnicast():
		return &RefusedError{a, "a link-local address"}
	case a.IsMulticast():
		return &RefusedError{a, "a multicast address"}
	case reserved4.Contains(a) || v4compat.Contains(a) || discard6.Contains(a):
		return &RefusedError{a, "a reserved address"}
	case !p.AllowPrivate && (a.IsPrivate() || cgnat.Contains(a) || siteLocal6.Contains(a) || nat64Local.Contains(a)):
		return &RefusedError{a, "a private address (allowed only with MOBILE_PUSH_ALLOW_PRIVATE=true or MOBILE_PUSH_ALLOW_NETS)"}
	}
	return nil
}

// embeddedIPv4 is the IPv4 address an IPv6 address of NAT64 or 6to4
// reaches.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// unmapPrefix turns ::ffff:a.b.c.d/n into a.b.c.d/(n-96), so an allowed
// network written either way matches the unmapped address CheckAddr looks
// at.
func unmapPrefix(n netip.Prefix) netip.Prefix {
	if n.Addr().Is4In6() && n.Bits() >= 96 {
		return netip.PrefixFrom(n.Addr().Unmap(), n.Bits()-96).Masked()
	}
	return n.Masked()
}

// CheckHost checks a URL's host (url.URL.Hostname) before any lookup: an
// address literal in any form a resolver takes (127.0.0.1, [::1],
// 2130706433, 0x7f.1, 0177.0.0.1) against the policy, and localhost's
// names as loopback. A numeric host in a form other than dotted decimal
// is refused even when its address is allowed: resolvers disagree on
// what it means. Other names pass: the dialer checks what they resolve to.
func (p Policy) CheckHost(host string) error {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if a, err := netip.ParseAddr(h); err == nil {
		return p.CheckAddr(a)
	}
	if a, ok := looseIPv4(h); ok {
		if err := p.CheckAddr(a); err != nil {
			return fmt.Errorf("host %s is %s written another way: %w", host, a, err)
		}
		return fmt.Errorf("host %s is the IPv4 address %s written in a non-standard form; write it %s", host, a, a)
	}
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		if err := p.CheckAddr(netip.AddrFrom4([4]byte{127, 0, 0, 1})); err != nil {
			return fmt.Errorf("host %s resolves to loopback: %w", host, err)
		}
	}
	return nil
}

// looseIPv4 parses the forms of an IPv4 address that inet_aton and the
// WHATWG URL standard take: one to four parts, each decimal, octal
// (leading 0) or hex (0x), the last filling the bytes left (127.1,
// 2130706433, 0x7f000001, 0177.0.0.01).
func looseIPv4(h string) (netip.Addr, bool) {
	parts := strings.Split(h, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	nums := make([]uint64, len(parts))
	for i, s := range parts {
		base := 10
		switch {
		case strings.HasPrefix(s, "0x"):
			s, base = s[2:], 16
			if s == "" {
				s = "0"
			}
		case len(s) > 1 && s[0] == '0':
			s, base = s[1:], 8
		}
		if s == "" || s[0] == '+' || s[0] == '-' {
			return netip.Addr{}, false
		}
		n, err := strconv.ParseUint(s, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		nums[i] = n
	}
	var v uint64
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, false
		}
		v |= n << (8 * (3 - i))
	}
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, false
	}
	v |= last
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// control is the dialer's check of each address it is about to connect
// to, after resolution: net.Dialer.Control.
func (p Policy) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Why: "not an address: " + address}
	}
	return p.CheckAddr(ap.Addr())
}

// ParseNets parses a comma-separated list of networks
// (MOBILE_PUSH_ALLOW_NETS): CIDRs such as 192.168.1.0/24 or fd12::/64, or
// single addresses.
func ParseNets(s string) ([]netip.Prefix, error) {
	var nets []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("%q is neither a network (a.b.c.d/n) nor an address", f)
			}
			nets = append(nets, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		n, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a network: %v", f, err)
		}
		nets = append(nets, unmapPrefix(n))
	}
	return nets, nil
}
