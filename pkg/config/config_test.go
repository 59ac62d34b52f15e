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

// TestBool: the variable's true and false, a bad value named, and the bare
// flag as true beating the variable.
func TestBool(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want bool
		bad  bool
	}{
		{"true", nil, true, false},
		{"0", nil, false, false},
		{"yes", nil, false, true},
		{"false", []string{"-on"}, true, false},
		{"true", []string{"-on=false"}, false, false},
	} {
		t.Setenv("CFG_TEST_ON", tc.env)
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var on bool
		Bool(fs, &on, "on", "CFG_TEST_ON", false, "")
		err := Parse(fs, tc.args)
		if (err != nil) != tc.bad || (!tc.bad && on != tc.want) {
			t.Errorf("env %q args %q: %v, %v; want %v (error %v)", tc.env, tc.args, on, err, tc.want, tc.bad)
		}
	}
}
