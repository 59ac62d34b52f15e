package edge

import (
	"flag"

	"github.com/hermes-mobile/gateway/pkg/config"
)

// RegisterFlags registers the edge's limits and timings as flags of fs, each
// falling back to its environment variable, with DefaultConfig's values as
// defaults; Validate checks what they were set to. Authentication (tokens,
// devices, proxies) needs parsing across settings and stays with the
// service; BlobTTL is left to the caller, which shares it with its router.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	def := DefaultConfig()
	env := fieldEnv
	config.Seconds(fs, &c.PingInterval, "ping-interval", env["PingInterval"], def.PingInterval, "keepalive: ping sockets silent this long; close those silent for 3 intervals")
	config.MiB(fs, &c.MaxReadBytes, "max-read", env["MaxReadBytes"], def.MaxReadBytes, "bytes of large messages being read, across the edge; past it a message gets a fatal internal_error")
	config.MiB(fs, &c.MaxHelloBytes, "max-hello", env["MaxHelloBytes"], def.MaxHelloBytes, "bytes the sockets in the hello phase may hold while their messages are read (12 KiB each), across the edge: the phase admits at most this / 12 KiB sockets")
	config.Int(fs, &c.MaxHelloConns, "max-hello-conns", env["MaxHelloConns"], def.MaxHelloConns, "sockets in the hello phase (upgraded, hello not answered yet), across the edge; past it a stranger that holds more than its share or waited an eighth of the hello timeout gives its place, else an upgrade gets HTTP 503 with Retry-After")
	config.Int(fs, &c.MaxHelloConnsPerAddr, "max-hello-per-addr", env["MaxHelloConnsPerAddr"], def.MaxHelloConnsPerAddr, "sockets whose hello was not accepted yet from one source (an address after trusted proxies, grouped by -hello-prefix-v4/-v6); past it the source's own oldest gives its place if it waited an eighth of the hello timeout, else HTTP 503")
	config.Int(fs, &c.HelloPrefixV4, "hello-prefix-v4", env["HelloPrefixV4"], def.HelloPrefixV4, "bits of an IPv4 client address that name one source for the hello phase's per-source bound")
	config.Int(fs, &c.HelloPrefixV6, "hello-prefix-v6", env["HelloPrefixV6"], def.HelloPrefixV6, "bits of an IPv6 client address that name one source for the hello phase's per-source bound (a client holds a whole /64)")
	config.MiB(fs, &c.MaxQueuedBytes, "max-queued", env["MaxQueuedBytes"], def.MaxQueuedBytes, "bytes queued to phones, across the edge; past it sockets with over 1 MiB queued are closed as slow readers")
	config.MiB(fs, &c.MaxUploadBytes, "max-upload", env["MaxUploadBytes"], def.MaxUploadBytes, "bytes of unfinished uploads, across the edge; past it a part gets internal_error")
	config.Seconds(fs, &c.WriteTimeout, "write-timeout", env["WriteTimeout"], def.WriteTimeout, "a phone whose TCP acknowledges nothing this long while a write waits is cut off")
	config.Seconds(fs, &c.ReadTimeout, "read-timeout", env["ReadTimeout"], def.ReadTimeout, "bound on the arrival of one whole message once its first byte came")
	config.MiB(fs, &c.MaxOutboundBytes, "max-outbound", env["MaxOutboundBytes"], def.MaxOutboundBytes, "frames queued for one socket; past it the socket is closed as a slow reader")
	config.Seconds(fs, &c.OwnerTTL, "owner-ttl", env["OwnerTTL"], def.OwnerTTL, "a device's owner record lives this long without the edge's heartbeat (every third of it)")
	config.Seconds(fs, &c.PageTimeout, "page-timeout", env["PageTimeout"], def.PageTimeout, "a page request's headers must arrive within this once its first line came (idle page connections: 6×, writes: 3×)")
	config.Int(fs, &c.MaxPageConns, "max-page-conns", env["MaxPageConns"], def.MaxPageConns, "open connections for the pages (not /ws) across the edge; past it a page request is answered 503")
	// shim(v0.2.0): Config.DeviceSubjects.
	config.Bool(fs, &c.DeviceSubjects, "device-subjects", env["DeviceSubjects"], def.DeviceSubjects, "also subscribe to each phone's device subject, as edges before edge subjects did: for a rolling upgrade from such a release (a subscription per phone)")
	config.Seconds(fs, &c.AckWait, "ack-wait", env["AckWait"], def.AckWait, "how long a delivery to a phone that acks waits for its ack (under the router's 15 s)")
}

// fieldEnv is the environment variable of each Config field that has one
// (BlobTTL's is the service's), so Validate's errors name what an operator
// sets.
var fieldEnv = map[string]string{
	"PingInterval":         "MOBILE_PING_INTERVAL",
	"MaxReadBytes":         "MOBILE_MAX_READ_MIB",
	"MaxHelloBytes":        "MOBILE_MAX_HELLO_MIB",
	"MaxHelloConns":        "MOBILE_MAX_HELLO_CONNS",
	"MaxHelloConnsPerAddr": "MOBILE_MAX_HELLO_PER_ADDR",
	"HelloPrefixV4":        "MOBILE_HELLO_PREFIX_V4",
	"HelloPrefixV6":        "MOBILE_HELLO_PREFIX_V6",
	"MaxQueuedBytes":       "MOBILE_MAX_QUEUED_MIB",
	"MaxUploadBytes":       "MOBILE_MAX_UPLOAD_MIB",
	"WriteTimeout":         "MOBILE_WRITE_TIMEOUT",
	"ReadTimeout":          "MOBILE_READ_TIMEOUT",
	"MaxOutboundBytes":     "MOBILE_MAX_OUTBOUND_MIB",
	"OwnerTTL":             "MOBILE_OWNER_TTL",
	"PageTimeout":          "MOBILE_PAGE_TIMEOUT",
	"MaxPageConns":         "MOBILE_MAX_PAGE_CONNS",
	"AckWait":              "MOBILE_ACK_WAIT",
	"DeviceSubjects":       "MOBILE_DEVICE_SUBJECTS",
	"BlobTTL":              "MOBILE_BLOB_TTL",
}

// setting names field in an error: its variable, or "edge: <field>" for
// one set only in code.
func setting(field string) string {
	if env, ok := fieldEnv[field]; ok {
		return env
	}
	return "edge: " + field
}
