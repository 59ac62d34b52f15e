package config

import (
	"flag"
	"strings"
	"testing"
	"time"
)

// TestParseReportsEveryBadVariable: every invalid variable is named in one
// error, and a flag on the command line beats its variable (whose value is
// then not even read).
func TestParseReportsEveryBadVariable(t *testing.T) {
	t.Setenv("CFG_TEST_WAIT", "soon")
	t.Setenv("CFG_TEST_SIZE", "0")
	t.Setenv("CFG_TEST_NAME", "from-env")
	t.Setenv("CFG_TEST_OTHER", "-5")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var wait, other time.Duration
	var size int64
	var name string
	Seconds(fs, &wait, "wait", "CFG_TEST_WAIT", time.Second, "")
	Seconds(fs, &other, "other", "CFG_TEST_OTHER", time.Second, "")
	MiB(fs, &size, "size", "CFG_TEST_SIZE", 1<<20, "")
	String(fs, &name, "name", "CFG_TEST_NAME", "default", "")
	err := Parse(fs, []string{"-other=7"})
	if err == nil {
		t.Fatal("bad variables accepted")
	}
	for _, v := range []string{"$CFG_TEST_WAIT", "$CFG_TEST_SIZE"} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("the error does not name %s: %v", v, err)
		}
	}
	if strings.Contains(err.Error(), "CFG_TEST_OTHER") {
		t.Errorf("a variable whose flag was given was read: %v", err)
	}
	if other != 7*time.Second || name != "from-env" {
		t.Errorf("other = %v, name = %q; want the flag's 7s and the variable's from-env", other, name)
	}
}
