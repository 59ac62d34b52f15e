package redisstore

import (
	"fmt"
	neturl "net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Modes of Options.Mode: how Options.URL names the Redis.
const (
	// ModeSingle: one server, redis://[user:password@]host:port[/db]
	// (redis.ParseURL).
	ModeSingle = "single"
	// ModeCluster: a Redis Cluster, redis://[user:password@]host:port?addr=host:port&addr=…
	// (redis.ParseClusterURL): any of its masters or replicas, the client
	// learns the rest. The shared state is split into Shards.
	ModeCluster = "cluster"
	// ModeSentinel: a master found through Redis Sentinel,
	// redis://[sentinel-user:sentinel-password@]host:port?master_name=NAME&addr=host:port&password=…
	// (redis.ParseFailoverURL): the sentinels' addresses, the master's
	// name, and the master's own password as the password parameter.
	ModeSentinel = "sentinel"
)

// NewClient makes the client of url for mode with the settings every Store
// needs (see Options.URL): the caller's context bounds each call, a refused
// dial fails at once, no command is retried unless the URL says so, and a
// pool of poolSize connections (per node of a cluster; DefaultPoolSize when
// not positive) unless the URL's pool_size says otherwise.
func NewClient(mode, url string, poolSize int) (redis.UniversalClient, error) {
	if err := CheckURL(mode, url); err != nil {
		return nil, err
	}
	if poolSize <= 0 {
		poolSize = DefaultPoolSize
	}
	switch mode {
	case "", ModeSingle:
		o, err := redis.ParseURL(url)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled, o.DialerRetries = true, 1
		if o.PoolSize == 0 {
			o.PoolSize = poolSize
		}
		if o.MaxRetries == 0 {
			o.MaxRetries = -1 // none; 0 would mean go-redis's default, 3
		}
		return redis.NewClient(o), nil
	case ModeCluster:
		o, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled, o.DialerRetries = true, 1
		if o.PoolSize == 0 {
			o.PoolSize = poolSize
		}
		if o.MaxRetries == 0 {
			o.MaxRetries = -1
		}
		return redis.NewClusterClient(o), nil
	case ModeSentinel:
		o, err := redis.ParseFailoverURL(url)
		if err != nil {
			return nil, err
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("sentinel URL %q has no master_name parameter", redactURL(url))
		}
		o.ContextTimeoutEnabled, o.DialerRetries = true, 1
		if o.PoolSize == 0 {
			o.PoolSize = poolSize
		}
		if o.MaxRetries == 0 {
			o.MaxRetries = -1
		}
		return redis.NewFailoverClient(o), nil
	}
	return nil, fmt.Errorf("unknown mode %q: single, cluster or sentinel", mode)
}

// redactURL is url without its passwords, for errors.
// CheckURL tells whether url can name a Redis for mode: a redis:// or
// rediss:// URL with a host, or for ModeSingle a unix:// socket. Its
// error says what was given (its credentials and query hidden) and what
// is expected; go-redis's own says only "invalid URL scheme: ", or
// nothing of the URL at all.
func CheckURL(mode, url string) error {
	u, err := neturl.Parse(url)
	if err == nil && u.Opaque == "" {
		switch {
		case (u.Scheme == "redis" || u.Scheme == "rediss") && u.Host != "":
			return nil
		case u.Scheme == "unix" && (mode == "" || mode == ModeSingle):
			return nil
		}
	}
	return fmt.Errorf("%q is not a redis:// or rediss:// URL", redactText(url))
}

// redactText hides what may be a password in text that need not parse as
// a URL: the query and anything before an @.
func redactText(s string) string {
	if i := strings.IndexByte(s, '?'); i >= 0 {
		s = s[:i+1] + "xxxxx"
	}
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		head := ""
		if j := strings.Index(s[:i], "://"); j >= 0 {
			head = s[:j+3]
		}
		s = head + "xxxxx" + s[i:]
	}
	return s
}

func redactURL(url string) string {
	if u, err := neturl.Parse(url); err == nil {
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return "(unparsable)"
}
