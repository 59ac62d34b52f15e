package secret

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const raw = "tok-3f9a1c"

// TestNeverPrints: no verb of fmt, no log handler, no encoding and no
// flag's -help shows the value, whether the Secret is a value, a pointer or
// a field of a struct.
func TestNeverPrints(t *testing.T) {
	s := Secret(raw)
	cfg := struct {
		Token Secret
		Ptr   *Secret
	}{s, &s}
	var out []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		out = append(out, fmt.Sprintf(verb, s), fmt.Sprintf(verb, &s), fmt.Sprintf(verb, cfg))
	}
	out = append(out, fmt.Sprint(s), fmt.Sprintln(cfg))
	j, _ := json.Marshal(cfg)
	out = append(out, string(j))
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "token", s, "cfg", cfg)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "token", s)
	out = append(out, logs.String())
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var f Secret
	fs.Var(&f, "token", "the token")
	if err := fs.Parse([]string{"-token=" + raw}); err != nil || string(f) != raw {
		t.Fatalf("-token parsed as %q, %v", string(f), err)
	}
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.PrintDefaults()
	out = append(out, help.String())
	for _, o := range out {
		if strings.Contains(o, raw) {
			t.Errorf("the value shows in %q", o)
		}
	}
	if got := fmt.Sprint(Secret("")); got != "" {
		t.Errorf("an empty secret prints %q, want nothing", got)
	}
}
