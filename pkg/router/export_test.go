package router

import "github.com/hermes-mobile/gateway/pkg/dispatch"

// Groups returns the groups POST /v1/deliver's requests go by, so that a
// test can hold an edge's turn until its request is answered and see who
// waits for it.
func (a *API) Groups() *dispatch.Groups { return a.groups }
