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

// envErrs are environment values that could not be parsed; see EnvErrors.
var envErrs []error

// EnvErrors reports the environment variables whose values were invalid
// when their flags were registered. A command refuses to start on them, as
// it does on a bad flag.
func EnvErrors() error { return errors.Join(envErrs...) }

// String registers a string flag whose default comes from env.
func String(fs *flag.FlagSet, p *string, name, env, def, usage string) {
	if v, ok := os.LookupEnv(env); ok {
		def = v
	}
	fs.StringVar(p, name, def, usage+" ($"+env+")")
}

// Seconds registers a duration flag given in whole seconds (as the env var
// is), or as a Go duration ("90s", "5m").
func Seconds(fs *flag.FlagSet, p *time.Duration, name, env string, def time.Duration, usage string) {
	*p = def
	if v, ok := os.LookupEnv(env); ok {
		if d, err := parseSeconds(v); err == nil {
			*p = d
		} else {
			envErrs = append(envErrs, fmt.Errorf("$%s: %w", env, err))
		}
	}
	fs.Func(name, usage+" in seconds ($"+env+", default "+strconv.Itoa(int(def/time.Second))+")", func(s string) error {
		d, err := parseSeconds(s)
		if err == nil {
			*p = d
		}
		return err
	})
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

// Secret is a flag value that never prints (see package secret).
type Secret = secret.Secret

// SecretVar registers a secret flag whose default comes from env.
func SecretVar(fs *flag.FlagSet, p *Secret, name, env, usage string) {
	if v, ok := os.LookupEnv(env); ok {
		*p = Secret(v)
	}
	fs.Var(p, name, usage+" ($"+env+")")
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
func MiB(fs *flag.FlagSet, p *int64, name, env string, def int64, usage string) {
	*p = def
	parse := func(s string) (int64, error) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n > 1<<20 {
			return 0, fmt.Errorf("%q: want a whole number of MiB between 1 and 1048576", s)
		}
		return n << 20, nil
	}
	if v, ok := os.LookupEnv(env); ok {
		if n, err := parse(v); err == nil {
			*p = n
		} else {
			envErrs = append(envErrs, fmt.Errorf("$%s: %w", env, err))
		}
	}
	fs.Func(name, usage+" in MiB ($"+env+", default "+strconv.FormatInt(def>>20, 10)+")", func(s string) error {
		n, err := parse(s)
		if err == nil {
			*p = n
		}
		return err
	})
}
