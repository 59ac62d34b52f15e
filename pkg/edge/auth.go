package edge

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/tokens"
)

// AuthConfig says who may connect.
type AuthConfig struct {
	// Token is the app token (MOBILE_TOKEN).
	Token secret.Secret
	// ExtraTokens binds tokens to device ids (MOBILE_EXTRA_TOKENS,
	// device_id=token): such a token connects only as its device, and a bound
	// device connects only with its token.
	ExtraTokens map[string]secret.Secret
	// AllowedDevices, when not empty, is the only device ids accepted
	// (MOBILE_ALLOWED_DEVICES).
	AllowedDevices []string
	// DeliverTokens authenticate service connections allowed to send deliver
	// frames from anywhere (MOBILE_DELIVER_TOKENS).
	DeliverTokens []secret.Secret
	// TrustedProxies are the peers whose forwarding header names the client
	// (MOBILE_TRUSTED_PROXIES).
	TrustedProxies []netip.Prefix
	// Tenants, when set, is the tenants file (MOBILE_TENANTS_FILE): its
	// app, device and deliver keys connect as their owners' devices, and
	// a socket whose key a reload removed is closed with auth_failed. The
	// tokens above stay the legacy owner's.
	Tenants *tenant.Registry
	// ForwardedHeader is the one header read from a trusted proxy
	// (MOBILE_FORWARDED_HEADER): HeaderXForwardedFor (the default) or
	// HeaderForwarded. The other is ignored: a client may have set it.
	ForwardedHeader string
}

// The forwarding headers a trusted proxy may name the client in.
const (
	HeaderXForwardedFor = "x-forwarded-for"
	HeaderForwarded     = "forwarded"
)

// ParseForwardedHeader checks MOBILE_FORWARDED_HEADER; empty is
// HeaderXForwardedFor.
func ParseForwardedHeader(s string) (string, error) {
	switch h := strings.ToLower(strings.TrimSpace(s)); h {
	case "":
		return HeaderXForwardedFor, nil
	case HeaderXForwardedFor, HeaderForwarded:
		return h, nil
	}
	return "", fmt.Errorf("MOBILE_FORWARDED_HEADER: %q is not x-forwarded-for or forwarded", s)
}

// ParseExtraTokens parses "device_id=token,device_id=token".
func ParseExtraTokens(s string) (map[string]secret.Secret, error) {
	m := make(map[string]secret.Secret)
	for i, item := range config.List(s) {
		dev, tok, ok := strings.Cut(item, "=")
		dev, tok = strings.TrimSpace(dev), strings.TrimSpace(tok)
		if !ok || dev == "" || tok == "" {
			// The entry may hold a token: name it by position only.
			return nil, fmt.Errorf("MOBILE_EXTRA_TOKENS: entry %d is not device_id=token", i+1)
		}
		if err := protocol.CheckDeviceID(dev); err != nil {
			return nil, fmt.Errorf("MOBILE_EXTRA_TOKENS: entry %d: %w", i+1, err)
		}
		m[dev] = secret.Secret(tok)
	}
	return m, nil
}

// ParseDevices parses the comma-separated device ids of the variable name
// (MOBILE_ALLOWED_DEVICES), refusing ids no device can have.
func ParseDevices(name, s string) ([]string, error) {
	var out []string
	for _, d := range config.List(s) {
		if err := protocol.CheckDeviceID(d); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// ParsePrefixes parses comma-separated CIDRs or addresses.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, item := range config.List(s) {
		if !strings.Contains(item, "/") {
			a, err := netip.ParseAddr(item)
			if err != nil {
				return nil, fmt.Errorf("MOBILE_TRUSTED_PROXIES: %w", err)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			return nil, fmt.Errorf("MOBILE_TRUSTED_PROXIES: %w", err)
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			// An IPv4-mapped CIDR is IPv4, as peers are compared unmapped.
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

type digest = tokens.Digest

// authenticator checks tokens in constant time: it compares fixed-length
// digests and always looks at every configured token.
type authenticator struct {
	tenants *tenant.Registry // nil: no tenants file
	main    digest
	hasMain bool
	bound   map[string]digest // device → its token
	deliver []digest
	allowed map[string]bool
}

func newAuthenticator(c AuthConfig) *authenticator {
	a := &authenticator{bound: make(map[string]digest), tenants: c.Tenants}
	if c.Token != "" {
		a.main, a.hasMain = tokens.Sum(string(c.Token)), true
	}
	for dev, tok := range c.ExtraTokens {
		a.bound[dev] = tokens.Sum(string(tok))
	}
	for _, tok := range c.DeliverTokens {
		a.deliver = append(a.deliver, tokens.Sum(string(tok)))
	}
	if len(c.AllowedDevices) > 0 {
		a.allowed = make(map[string]bool)
		for _, d := range c.AllowedDevices {
			a.allowed[d] = true
		}
	}
	return a
}

// grant is what a token allows.
type grant struct {
	valid   bool
	deliver bool // may send deliver frames from anywhere
	general bool // the app token or a deliver token: not bound to one device
	main    bool // the app token
	d       digest
	// key is the owner key of the tenants file that token is; nil for a
	// token of the environment (the legacy owner's).
	key *tenant.Key
}

// owner is the owner g's token belongs to.
func (g grant) owner() string {
	if g.key != nil {
		return g.key.Owner
	}
	return tenant.Legacy
}

func eq(a, b digest) bool { return tokens.Equal(a, b) }

func (a *authenticator) check(token string) grant {
	g := grant{d: tokens.Sum(token)}
	if token == "" {
		return g
	}
	if a.tenants != nil && tenant.IsCredential(token) {
		// An owner key: an agent's key does not connect a phone.
		k, ok := a.tenants.Snapshot().Verify(token)
		if !ok || k.Kind == tenant.KindAgent {
			return g
		}
		g.key, g.valid = k, true
		g.deliver = k.Kind == tenant.KindDeliver
		g.main = k.Kind == tenant.KindApp
		g.general = g.main || g.deliver
		return g
	}
	main := a.hasMain && eq(g.d, a.main)
	var del, extra bool
	for _, d := range a.deliver {
		del = eq(g.d, d) || del
	}
	for _, d := range a.bound {
		extra = eq(g.d, d) || extra
	}
	g.valid = main || del || extra
	g.deliver = del
	g.general = main || del
	g.main = main
	return g
}

// allowedDevice reports whether device may connect at all: true unless
// MOBILE_ALLOWED_DEVICES is set and does not name it.
// It is the legacy owner's list: an owner key's device is not held to it.
func (a *authenticator) allowedDevice(g grant, device string) bool {
	return g.key != nil || a.allowed == nil || a.allowed[device]
}

// kind names the token of g that admitted device (after bindingOK):
// "device" for the device's own token of MOBILE_EXTRA_TOKENS, "app" for
// MOBILE_TOKEN, "deliver" for one of MOBILE_DELIVER_TOKENS.
func (a *authenticator) kind(g grant, device string) string {
	if g.key != nil {
		return string(g.key.Kind)
	}
	switch {
	case a.bound[device] != digest{}:
		return "device"
	case g.main:
		return "app"
	default:
		return "deliver"
	}
}

// bindingOK reports whether the token of g may take device: a bound device
// needs its own token, and a bound token needs its own device.
// An owner key's device is its owner's: a device key takes only its
// device, and a device that a device key of the owner binds takes only
// such a key.
func (a *authenticator) bindingOK(g grant, device string) bool {
	if k := g.key; k != nil {
		if k.Kind == tenant.KindDevice {
			return device == k.Device
		}
		return !a.tenants.Snapshot().Bound(k.Owner, device)
	}
	if want, ok := a.bound[device]; ok {
		return eq(g.d, want)
	}
	return g.general
}

// revoke closes, with auth_failed, every socket admitted by an owner key
// that snap, a new reading of the tenants file, no longer holds (removed,
// or its secret, kind or device changed). The others notice nothing.
func (s *Server) revoke(snap *tenant.Snapshot) {
	var gone []*conn
	s.mu.Lock()
	for c := range s.conns {
		c.mu.Lock()
		k := c.key
		c.mu.Unlock()
		if k != nil && !snap.Has(k) {
			gone = append(gone, c)
		}
	}
	s.mu.Unlock()
	for _, c := range gone {
		c.fatal(errKeyRevoked)
	}
	if len(gone) > 0 {
		s.log.Info("closed the sockets of withdrawn keys", "sockets", len(gone))
	}
}
