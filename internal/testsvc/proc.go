package testsvc

import (
	"bytes"
	"fmt"
	"os"
	"time"
)

// WaitStopped waits until process pid is stopped (SIGSTOP): kill returns
// before every thread of the process has stopped, and a test that means
// "while it is frozen" must not race that. It returns an error when the
// state cannot be read (no /proc) or the process does not stop within 10 s.
func WaitStopped(pid int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return err
		}
		// "pid (comm) S …": the state follows the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'T' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d did not stop within 10 s: %s", pid, stat)
		}
		time.Sleep(time.Millisecond)
	}
}
