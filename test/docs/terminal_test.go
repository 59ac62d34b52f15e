//go:build linux

package docs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// A terminal is what the reader types the blocks into: one bash, in the
// clone, that runs block after block, so that cd, variables and jobs carry
// over from one to the next. It is a process group of its own; everything
// it starts (the "&" of a block too) is killed when the test ends.
type terminal struct {
	name   string
	dir    string   // the block files
	out    string   // the output file: the blocks' and their jobs', with set -x
	ctl    *os.File // the paths of block files to run, one a line
	pgid   int
	exited chan struct{}
	steps  int
}

// driver is the terminal's shell. It reads the path of a block file from
// fd 3 and sources it with its commands traced. set -e: a command that
// fails ends the terminal, as its error stops the reader, and the test
// fails with the output.
const driver = `set -e
trap 'echo "docs-test: exit status $? of: $BASH_COMMAND"' ERR
while IFS= read -r -u 3 step; do
	set -x
	. "$step" 3<&-
	{ set +x; } 2>/dev/null
	echo "docs-test: done with $step"
done
`

func (d *docs) terminal(t *testing.T, name string) *terminal {
	t.Helper()
	dir := filepath.Join(d.tmp, "terminals", strings.ReplaceAll(name, " ", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tm := &terminal{name: name, dir: dir, out: filepath.Join(dir, "output"), exited: make(chan struct{})}
	out, err := os.Create(tm.out)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := newCommand(d.clone, d.env, out, r, "bash", "--noprofile", "--norc", "-c", driver)
	if err := cmd.Start(); err != nil {
		w.Close()
		t.Fatal(err)
	}
	tm.ctl, tm.pgid = w, cmd.Process.Pid
	go func() {
		_ = cmd.Wait() // the exit shows in the output
		close(tm.exited)
	}()
	t.Cleanup(func() { tm.close(t) })
	return tm
}

// start types b and returns at once: b ends in a server in the foreground.
// It returns where b's output starts.
func (tm *terminal) start(t *testing.T, b *block) int {
	t.Helper()
	tm.steps++
	path := filepath.Join(tm.dir, fmt.Sprintf("%02d-%s.sh", tm.steps, b.name))
	body := b.body
	if b.saveAs != "" { // what the reader saves, saved where the reader is
		body = "cat >" + shellQuote(b.saveAs) + " <<'DOCS_TEST_EOF'\n" + b.body + "DOCS_TEST_EOF\n"
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	from := len(tm.output())
	if _, err := fmt.Fprintln(tm.ctl, path); err != nil {
		t.Fatalf("the %s terminal takes no more commands (%v):\n%s", tm.name, err, tm.tail(from))
	}
	return from
}

// run types b and waits until it is through, within limit, and returns
// what it printed (its background jobs' lines among it).
func (tm *terminal) run(t *testing.T, b *block, limit time.Duration) string {
	t.Helper()
	from := tm.start(t, b)
	done := fmt.Sprintf("docs-test: done with %s/%02d-%s.sh\n", tm.dir, tm.steps, b.name)
	tm.wait(t, limit, b.name+" ("+b.where+") to finish", from, func(out string) bool {
		return strings.Contains(out, done)
	})
	out, _, _ := strings.Cut(tm.output()[from:], done)
	return out
}

// save saves the file block b as the reader does, where the reader is.
func (tm *terminal) save(t *testing.T, b *block) {
	t.Helper()
	if b.saveAs == "" {
		t.Fatalf("%s: %s is not marked file=FILE", b.where, b.name)
	}
	tm.run(t, b, time.Minute)
}

// waitMatch waits until the output since from matches re and returns the
// match's groups.
func (tm *terminal) waitMatch(t *testing.T, limit time.Duration, what string, from int, re *regexp.Regexp) []string {
	t.Helper()
	var m []string
	tm.wait(t, limit, what, from, func(out string) bool {
		m = re.FindStringSubmatch(out)
		return m != nil
	})
	return m
}

// wait polls the output since from until cond holds, and fails t with the
// output when the limit passes or the terminal ends first.
func (tm *terminal) wait(t *testing.T, limit time.Duration, what string, from int, cond func(out string) bool) {
	t.Helper()
	ok, ended := false, false
	testsvc.Eventually(limit, func() bool {
		select {
		case <-tm.exited:
			ended = true
		default:
		}
		ok = cond(tm.output()[from:])
		return ok || ended
	})
	switch {
	case ok:
	case ended:
		t.Fatalf("the %s terminal ended before %s; its output:\n%s", tm.name, what, tm.tail(from))
	default:
		t.Fatalf("waited %v for %s in the %s terminal; its output:\n%s", testsvc.Slack(limit), what, tm.name, tm.tail(from))
	}
}

// interrupt is Ctrl-C: SIGINT to the terminal's process group.
func (tm *terminal) interrupt(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(-tm.pgid, syscall.SIGINT); err != nil {
		t.Fatalf("Ctrl-C in the %s terminal: %v", tm.name, err)
	}
}

func (tm *terminal) output() string {
	b, _ := os.ReadFile(tm.out) // there from the start; a read error reads as no output
	return string(b)
}

// tail is the last 60 lines of the output since from.
func (tm *terminal) tail(from int) string {
	lines := strings.Split(strings.TrimRight(tm.output()[from:], "\n"), "\n")
	if len(lines) > 60 {
		lines = append([]string{"…"}, lines[len(lines)-60:]...)
	}
	return strings.Join(lines, "\n")
}

// close ends the terminal: no more input, then SIGTERM to whatever of its
// process group still runs, SIGKILL 10 s later. It logs the output.
func (tm *terminal) close(t *testing.T) {
	_ = tm.ctl.Close() // the shell reads EOF and exits
	if left := groupMembers(tm.pgid); len(left) > 0 {
		_ = syscall.Kill(-tm.pgid, syscall.SIGTERM) // ESRCH: gone meanwhile
		if !testsvc.Eventually(10*time.Second, func() bool { return len(groupMembers(tm.pgid)) == 0 }) {
			t.Logf("the %s terminal's %s outlived SIGTERM by 10 s: killing them", tm.name, tm.started())
			_ = syscall.Kill(-tm.pgid, syscall.SIGKILL)
			testsvc.Eventually(10*time.Second, func() bool { return len(groupMembers(tm.pgid)) == 0 })
		}
	}
	t.Logf("the %s terminal's output:\n%s", tm.name, tm.output())
}

// groupMembers are the live processes (zombies left out: nobody may reap
// an orphan here) of process group pgid, by pid → command line.
func groupMembers(pgid int) map[int]string {
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	members := map[int]string{}
	for _, p := range procs {
		stat, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid pgrp …": the fields after the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if i < 0 || len(f) < 3 || f[0] == "Z" || f[2] != strconv.Itoa(pgid) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		members[pid] = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return members
}

// started describes the processes the terminal's blocks started that still
// run (its shell left out).
func (tm *terminal) started() string {
	var s []string
	for pid, cmd := range groupMembers(tm.pgid) {
		if pid != tm.pgid {
			s = append(s, fmt.Sprintf("%d %q", pid, cmd))
		}
	}
	return "processes " + strings.Join(s, ", ")
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
