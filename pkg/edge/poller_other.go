//go:build !linux

package edge

import (
	"errors"
	"net"
)

// Without epoll, every connection falls back to a reading goroutine.
type poller struct{}

type pollEntry struct{}

var errNotPollable = errors.New("edge: connection cannot be polled")

func sharedPoller() (*poller, error)                           { return nil, errNotPollable }
func (p *poller) add(net.Conn, func(*pollEntry), func()) error { return errNotPollable }
func (p *poller) resume(*pollEntry) error                      { return errNotPollable }
func (p *poller) remove(*pollEntry)                            {}
