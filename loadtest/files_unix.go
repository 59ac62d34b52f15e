//go:build unix

package main

import (
	"fmt"
	"syscall"
)

// filesHeadroom is what a process needs besides its connections: standard
// streams, HTTP clients, the runtime.
const filesHeadroom = 256

// checkFiles refuses a run whose connections would not fit the process's
// open-file limit (Go raises the soft limit to the hard one at start).
func checkFiles(conns int) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return nil
	}
	if need := uint64(conns) + filesHeadroom; rl.Cur < need {
		return fmt.Errorf("-conns %d needs %d open files, the limit is %d: use fewer connections per process (see loadtest/README.md)", conns, need, rl.Cur)
	}
	return nil
}
