package admin

import (
	"fmt"
	"net/http/pprof"
	"strings"
)

// HandlePprof mounts the Go runtime's profiles (net/http/pprof) under
// /debug/pprof/ on the admin port: CPU (/debug/pprof/profile?seconds=N),
// heap, goroutines, mutex and block profiles, and execution traces. The
// command line is not served: a secret given as a flag would be on it. A
// service mounts them only when MOBILE_PPROF=on: a CPU profile or trace
// costs the process while it runs.
func (s *Server) HandlePprof() {
	s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// PprofSetting reads MOBILE_PPROF: "on" or "off" (any case, surrounding
// spaces ignored); anything else is an error naming the variable.
func PprofSetting(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on":
		return true, nil
	case "off", "":
		return false, nil
	}
	return false, fmt.Errorf("MOBILE_PPROF: %q is neither on nor off", v)
}
