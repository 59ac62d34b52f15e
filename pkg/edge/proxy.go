package edge

import (
	"net/netip"
	"strings"
)

// trustedProxy reports whether peer is a configured reverse proxy.
func (s *Server) trustedProxy(peer netip.Addr) bool {
	for _, p := range s.cfg.Auth.TrustedProxies {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

// forwardedHeader is the header read from trusted proxies.
func (s *Server) forwardedHeader() string {
	if s.cfg.Auth.ForwardedHeader == HeaderForwarded {
		return HeaderForwarded
	}
	return HeaderXForwardedFor
}

// clientFromHeaders finds the client behind trusted proxies in h, the
// value of the configured forwarding header (X-Forwarded-For, or Forwarded
// for=): the rightmost address that is not itself a trusted proxy. Without
// one the client is unknown (the zero Addr), which is never loopback: a
// proxy on the same host gives nobody a free pass for deliver.
func (s *Server) clientFromHeaders(h string) netip.Addr {
	var hops []string
	switch {
	case h == "":
	case s.forwardedHeader() == HeaderForwarded:
		hops = forwardedFor(h)
	default:
		hops = strings.Split(h, ",")
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			return netip.Addr{}
		}
		if !s.trustedProxy(a) {
			return a
		}
	}
	return netip.Addr{}
}

// warnUntrustedForwarding logs, once per Server, a forwarding header from a
// loopback peer that is not a trusted proxy: most likely a proxy on the same
// host that MOBILE_TRUSTED_PROXIES does not name, so every client behind it
// looks local (and may deliver).
func (s *Server) warnUntrustedForwarding(peer netip.Addr) {
	if s.warnedForwarding.CompareAndSwap(false, true) {
		s.log.Warn("a forwarding header came from a loopback peer that is not a trusted proxy: every client behind a proxy on this host counts as local and may deliver; name the proxy in MOBILE_TRUSTED_PROXIES",
			"peer", peer.String())
	}
}

// forwardedFor returns the for= values of an RFC 7239 Forwarded header.
func forwardedFor(h string) []string {
	var out []string
	for _, elem := range strings.Split(h, ",") {
		for _, pair := range strings.Split(elem, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
			if ok && strings.EqualFold(k, "for") {
				out = append(out, v)
			}
		}
	}
	return out
}

// parseHop parses 1.2.3.4, 1.2.3.4:56, [::1]:56, "[::1]" and ::1.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	return a.Unmap(), err == nil
}
