// Package config registers command-line flags that fall back to environment
// variables, so every setting is both a flag and an env var, and -help lists
// them with the variable's name.
package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hermes-mobile/gateway/pkg/secret"
)

// envFlag is a flag that falls back to an environment variable; Parse
// applies the variable.
type envFlag struct {
	flag.Value
	env string
}

// String is safe on the zero envFlag, which flag.PrintDefaults makes.
func (e *envFlag) String() string {
	if e == nil || e.Value == nil {
		return ""
	}
	return e.Value.String()
}

// IsBoolFlag passes a Bool's bareness on to the flag package.
func (e *envFlag) IsBoolFlag() bool {
	b, ok := e.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func register(fs *flag.FlagSet, v flag.Value, name, env, usage string) {
	fs.Var(&envFlag{v, env}, name, usage+" ($"+env+")")
}

// Parse parses args, then gives every flag registered here that is not on
// the command line the value of its environment variable, when that is
// set: a flag beats its variable. Every invalid variable is reported, each
// naming itself, in one error; a command refuses to start on it, as it does
// on a bad flag.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		ef, ok := f.Value.(*envFlag)
		if !ok || given[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(ef.env); ok {
			if err := ef.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("$%s: %w", ef.env, err))
			}
		}
	})
	return errors.Join(errs...)
}

// funcValue is a flag.Value from a parse function and a printer.
type funcValue struct {
	set func(string) error
	str func() string
}

func (v funcValue) Set(s string) error { return v.set(s) }
func (v funcValue) String() string     { return v.str() }

// String registers a string flag that falls back to env.
func String(fs *flag.FlagSet, p *string, name, env, def, usage string) {
	*p = def
	register(fs, funcValue{func(s string) error { *p = s; return nil }, func() string { return *p }}, name, env, usage)
}

// Seconds registers a duration flag given in whole seconds (as the env var
// is), or as a Go duration ("90s", "5m").
func Seconds(fs *flag.FlagSet, p *time.Duration, name, env string, def time.Duration, usage string) {
	*p = def
	register(fs, funcValue{func(s string) error {
		d, err := parseSeconds(s)
		if err == nil {
			*p = d
		}
		return err
	}, func() string { return p.String() }}, name, env, usage+", in seconds")
}

func parseSeconds(s string) (time.Duration, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 {
			return 0, fmt.Errorf("%q: must be positive", s)
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want a positive number of seconds", s)
	}
	return d, nil
}

// Secret registers a flag of a token or key that falls back to env; it
// never prints, in -help or anywhere (see package secret).
func Secret(fs *flag.FlagSet, p *secret.Secret, name, env, usage string) {
	register(fs, p, name, env, usage)
}

// List splits a comma-separated setting into its non-empty, trimmed items.
func List(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// MiB registers a size flag given in whole mebibytes (as the env var is);
// *p is in bytes.
func MiB[T ~int | ~int64](fs *flag.FlagSet, p *T, name, env string, def T, usage string) {
	*p = def
	register(fs, funcValue{func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n > 1<<20 {
			return fmt.Errorf("%q: want a whole number of MiB between 1 and 1048576", s)
		}
		*p = T(n << 20)
		return nil
	}, func() string { return strconv.FormatInt(int64(*p)>>20, 10) }}, name, env, usage+", in MiB")
}

// Bool registers a flag that is true for 1, t, true (any case) and false
// for 0, f, false, falling back to env; on the command line the bare flag
// means true.
func Bool(fs *flag.FlagSet, p *bool, name, env string, def bool, usage string) {
	*p = def
	register(fs, boolValue{funcValue{func(s string) error {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%q: want true or false", s)
		}
		*p = b
		return nil
	}, func() string { return strconv.FormatBool(*p) }}}, name, env, usage)
}

// boolValue lets the flag package take a bare -name as true.
type boolValue struct{ funcValue }

func (boolValue) IsBoolFlag() bool { return true }

// Int registers a positive whole-number flag that falls back to env.
func Int(fs *flag.FlagSet, p *int, name, env string, def int, usage string) {
	*p = def
	register(fs, funcValue{func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q: want a positive whole number", s)
		}
		*p = n
		return nil
	}, func() string { return strconv.Itoa(*p) }}, name, env, usage)
}
