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
	config.Seconds(fs, &c.PingInterval, "ping-interval", "MOBILE_PING_INTERVAL", def.PingInterval, "keepalive: ping sockets silent this long; close those silent for 3 intervals")
	config.MiB(fs, &c.MaxReadBytes, "max-read", "MOBILE_MAX_READ_MIB", def.MaxReadBytes, "bytes of large messages being read, across the edge; past it a message gets a fatal internal_error")
	config.MiB(fs, &c.MaxQueuedBytes, "max-queued", "MOBILE_MAX_QUEUED_MIB", def.MaxQueuedBytes, "bytes queued to phones, across the edge; past it sockets with over 1 MiB queued are closed as slow readers")
	config.MiB(fs, &c.MaxUploadBytes, "max-upload", "MOBILE_MAX_UPLOAD_MIB", def.MaxUploadBytes, "bytes of unfinished uploads, across the edge; past it a part gets internal_error")
	config.Seconds(fs, &c.WriteTimeout, "write-timeout", "MOBILE_WRITE_TIMEOUT", def.WriteTimeout, "a phone whose TCP acknowledges nothing this long while a write waits is cut off")
	config.Seconds(fs, &c.ReadTimeout, "read-timeout", "MOBILE_READ_TIMEOUT", def.ReadTimeout, "bound on the arrival of one whole message once its first byte came")
	config.MiB(fs, &c.MaxOutboundBytes, "max-outbound", "MOBILE_MAX_OUTBOUND_MIB", def.MaxOutboundBytes, "frames queued for one socket; past it the socket is closed as a slow reader")
	config.Seconds(fs, &c.OwnerTTL, "owner-ttl", "MOBILE_OWNER_TTL", def.OwnerTTL, "a device's owner record lives this long without the edge's heartbeat (every third of it)")
	config.Seconds(fs, &c.PageTimeout, "page-timeout", "MOBILE_PAGE_TIMEOUT", def.PageTimeout, "a page request's headers must arrive within this once its first line came (idle page connections: 6×, writes: 3×)")
	config.Int(fs, &c.MaxPageConns, "max-page-conns", "MOBILE_MAX_PAGE_CONNS", def.MaxPageConns, "open connections for the pages (not /ws) across the edge; past it a page request is answered 503")
	config.Seconds(fs, &c.AckWait, "ack-wait", "MOBILE_ACK_WAIT", def.AckWait, "how long a delivery to a phone that acks waits for its ack (under the router's 15 s)")
}
