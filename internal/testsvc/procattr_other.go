//go:build !linux

package testsvc

import "os/exec"

// setProcAttr: only Linux can tie a child's life to its parent's.
func setProcAttr(*exec.Cmd) {}
