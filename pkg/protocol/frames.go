package protocol

import "time"

// Frame types, the lowercased value of t.
const (
	TypeHello      = "hello"
	TypeText       = "text"
	TypeAudio      = "audio"
	TypeMedia      = "media"
	TypePrompt     = "prompt"
	TypeTyping     = "typing"
	TypePing       = "ping"
	TypeAck        = "ack"
	TypeDeliver    = "deliver"
	TypeReady      = "ready"
	TypeMessage    = "message"
	TypePromptDone = "prompt_done"
	TypeAvatar     = "avatar"
	TypePong       = "pong"
	TypeError      = "error"
	TypeDelivered  = "delivered"
	// TypePush registers the app's push token (client to server) and
	// answers it (server to client): an extension of Protocol v1, see
	// docs/protocol-notes.md. A server that does not know it ignores it,
	// as the spec says of an unknown type.
	TypePush = "push"
)

// Push kinds an app registers over its socket: the token Firebase Cloud
// Messaging (Android) or the Apple Push Notification service (iOS) gave
// it. ready's capabilities.push lists those the server sends.
const (
	PushFCM  = "fcm"
	PushAPNs = "apns"
)

// PushKinds are the kinds a push frame may name.
var PushKinds = []string{PushFCM, PushAPNs}

// Avatar states.
const (
	AvatarIdle     = "idle"
	AvatarThinking = "thinking"
	AvatarSpeaking = "speaking"
)

// AvatarState returns s if it is a known avatar state and idle otherwise, as
// the server must replace any unknown state with idle.
func AvatarState(s string) string {
	switch s {
	case AvatarThinking, AvatarSpeaking:
		return s
	}
	return AvatarIdle
}

// Media kinds, per direction.
var (
	// MediaIn is what the server accepts from the app.
	MediaIn = []string{"image", "video", "document", "audio"}
	// MediaOut is what the server can send to the app.
	MediaOut = []string{"image", "voice", "video", "document", "animation"}
)

// AudioFormats are the accepted audio.format values.
var AudioFormats = []string{"wav", "ogg"}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// IsMediaIn reports whether kind may be uploaded by the app.
func IsMediaIn(kind string) bool { return contains(MediaIn, kind) }

// IsMediaOut reports whether kind may be sent to the app.
func IsMediaOut(kind string) bool { return contains(MediaOut, kind) }

// ClientFrame is one decoded, validated frame from the app. It is one of
// *Hello, *Text, *Audio, *MediaUp, *PromptAnswer, *Typing, *Ping, *Ack,
// *Deliver, *Push.
type ClientFrame interface{ Type() string }

// Device is the app's description of itself, every string truncated to 120
// characters.
type Device struct {
	ID         string `json:"id,omitempty"`
	Name       string `json:"name,omitempty"`
	Platform   string `json:"platform,omitempty"`
	AppVersion string `json:"app_version,omitempty"`
}

// User is which user Hermes sees the app as.
type User struct {
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
}

// Hello opens a session. Token is required; Device.ID may be empty (the
// server then generates dev-<hex>).
type Hello struct {
	Token  string
	Device Device
	User   User
}

// Text is a chat message from the app.
type Text struct {
	ID   string
	Text string
}

// Audio is a voice recording, decoded from base64.
type Audio struct {
	ID     string
	Format string
	Data   []byte
	Text   string // recognised text, when the app has its own STT
}

// MediaUp is one chunk of one file from the app.
type MediaUp struct {
	ID       string
	Kind     string
	Mime     string // derived from Filename when the app sent none
	Filename string
	Caption  string
	Data     []byte
	Part     int
	Parts    int
}

// PromptAnswer is the app's response to a card. At least one of OptionID and
// Text is non-empty.
type PromptAnswer struct {
	PromptID string
	OptionID string
	Text     string
}

// Typing says the user is typing.
type Typing struct{}

// Push registers Token, the app's FCM registration token or APNs device
// token (Kind), as its own device's push endpoint; an empty Token takes
// the device's registration of Kind back. Token is printable ASCII, at
// most MaxPushTokenBytes.
type Push struct {
	Kind  string
	Token string
}

// Ping asks for a pong carrying the same ts. TS is the raw JSON value, nil
// when absent.
type Ping struct{ TS []byte }

// Ack says the app displayed or played a message; the server ignores it.
type Ack struct{ ID string }

// Deliver is a service delivery (cron, hermes send): at least Text or Media.
type Deliver struct {
	ID     string
	Target string
	Text   string
	Media  *DeliverMedia
	// WaitAck ("wait":"ack", optional, as in POST /v1/deliver): delivered
	// only once the phone acknowledged it, also a phone that never acks.
	WaitAck bool
	// TTL ("ttl", optional, as in POST /v1/deliver): keep what the device
	// cannot take now for this long and send it on its next connection;
	// 0: refuse it device_offline.
	TTL time.Duration
}

// DeliverMedia is the attachment of a deliver frame.
type DeliverMedia struct {
	Kind     string
	Mime     string
	Filename string
	Data     []byte
}

func (*Hello) Type() string        { return TypeHello }
func (*Text) Type() string         { return TypeText }
func (*Audio) Type() string        { return TypeAudio }
func (*MediaUp) Type() string      { return TypeMedia }
func (*PromptAnswer) Type() string { return TypePrompt }
func (*Typing) Type() string       { return TypeTyping }
func (*Ping) Type() string         { return TypePing }
func (*Ack) Type() string          { return TypeAck }
func (*Deliver) Type() string      { return TypeDeliver }
func (*Push) Type() string         { return TypePush }
