package protocol

import (
	"strconv"
	"time"
)

// Limits of Protocol v1. Every value is the one in the specification's
// "Constraints and limits" table; the comment says what it protects.
const (
	// Version is declared to the client in ready.v.
	Version = 1

	// MaxFrameBytes bounds one WebSocket message (voice arrives in base64).
	// A larger message is answered with a fatal too_big and the socket is closed.
	MaxFrameBytes = 16 << 20
	// MaxTextChars bounds text and caption, counted in Unicode code points.
	MaxTextChars = 12000
	// MaxAudioBytes bounds one decoded voice recording.
	MaxAudioBytes = 8 << 20
	// MaxMediaBytes bounds one media file, in either direction.
	MaxMediaBytes = 8 << 20
	// MediaChunkBytes is the size of the chunks the server sends a file in.
	MediaChunkBytes = 3 << 20
	// MinMediaChunkBytes is the smallest chunk the parts ceiling is derived from.
	MinMediaChunkBytes = 4 << 10
	// MaxMediaParts is ceil(MaxMediaBytes / MinMediaChunkBytes).
	MaxMediaParts = (MaxMediaBytes + MinMediaChunkBytes - 1) / MinMediaChunkBytes
	// DefaultChunkLimit is how many characters one message frame carries.
	DefaultChunkLimit = 3500
	// DefaultPromptTTL is a card's lifetime unless the owner overrides it.
	DefaultPromptTTL = 300 * time.Second
	// MaxOpenUploads bounds the unfinished multi-part uploads of one device.
	MaxOpenUploads = 8
	// MaxUploadBufferBytes bounds the sum of one device's open upload buffers.
	MaxUploadBufferBytes = 8 << 20
	// HelloTimeout is how long the server waits for the first frame, hello.
	HelloTimeout = 15 * time.Second
	// TypingIdle is how long without messages before the avatar returns to idle.
	TypingIdle = 3 * time.Second
	// DedupWindow is how long a <chat_id>:<id> key is remembered.
	DedupWindow = 600 * time.Second

	// MaxIDChars is where a client id is truncated: the id of text,
	// audio, media, ack and deliver, and a prompt answer's prompt_id and
	// option_id.
	MaxIDChars = 128
	// MaxDeviceFieldChars is where device.* strings are truncated.
	MaxDeviceFieldChars = 120
	// MaxUserFieldChars is where user.id and user.name are truncated. The
	// specification names no bound for them; the device's is used.
	MaxUserFieldChars = 120
	// MaxMimeChars bounds a client's mime type (bytes): a longer one is
	// ignored and the type is derived from the filename.
	MaxMimeChars = 255
	// MaxFilenameChars is where a media filename is truncated.
	MaxFilenameChars = 200
	// MaxPingTSBytes bounds a ping's ts, which the pong echoes: larger
	// gets too_big, so a client cannot make the edge hold and send back
	// megabytes per ping.
	MaxPingTSBytes = 1024
	// MaxPushTokenBytes bounds a push frame's token (the gateway's
	// extension, not the specification's): neither FCM nor APNs promises
	// a length, and the store keeps one per device (push.MaxDeviceTokenBytes).
	MaxPushTokenBytes = 4096
)

// MiB formats a byte limit in whole mebibytes ("8 MiB"), for the error
// texts that name it.
func MiB(n int) string { return strconv.Itoa(n>>20) + " MiB" }

// CloseCode is the WebSocket close code sent with every fatal error
// (1008, policy violation); the close reason is the error code.
const CloseCode = 1008

// SessionPrefix makes the Hermes session of a device: mobile:<device.id>.
const SessionPrefix = "mobile:"

// Session returns the session address of a device id.
func Session(deviceID string) string { return SessionPrefix + deviceID }
