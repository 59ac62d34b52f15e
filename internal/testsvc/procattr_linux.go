package testsvc

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill the child if the test binary dies first
// (a panic, a -timeout), so no process is left behind.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
