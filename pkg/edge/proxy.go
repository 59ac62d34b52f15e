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

// clientFromHeaders finds the client behind trusted proxies: the rightmost
// address in X-Forwarded-For (or else Forwarded: for=) that is not itself a
// trusted proxy. Without such a header the client is unknown (the zero
// Addr), which is never loopback: a proxy on the same host gives nobody a
// free pass for deliver.
func (s *Server) clientFromHeaders(xff, fwd string) netip.Addr {
	var hops []string
	if xff != "" {
		hops = strings.Split(xff, ",")
	} else if fwd != "" {
		hops = forwardedFor(fwd)
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
