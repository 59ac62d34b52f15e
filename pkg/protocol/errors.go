package protocol

// Code is an error code of Protocol v1, sent in error.code.
type Code string

// The error codes of the specification's table, each with the situation that
// produces it.
const (
	// CodeBadFrame: not JSON, not UTF-8, not an object; a required field
	// missing or of the wrong type; an empty message; a repeated hello; a first
	// frame other than hello (fatal there).
	CodeBadFrame Code = "bad_frame"
	// CodeAuthFailed: invalid token or a device outside MOBILE_ALLOWED_DEVICES.
	// Always fatal, followed by close 1008.
	CodeAuthFailed Code = "auth_failed"
	// CodeForbidden: a token bound to another device (fatal), an answer to a
	// card of another device, or a deliver from an unprivileged connection.
	CodeForbidden Code = "forbidden"
	// CodeUnsupportedFrame: unsupported audio format or media kind.
	CodeUnsupportedFrame Code = "unsupported_frame"
	// CodeTooBig: a frame, text, audio or media limit exceeded; fatal only for
	// MaxFrameBytes.
	CodeTooBig Code = "too_big"
	// CodeDeviceOffline: a deliver to a device that is not online.
	CodeDeviceOffline Code = "device_offline"
	// CodeAuthRequired is declared by the specification; like the reference
	// adapter, the gateway answers a first frame other than hello with
	// bad_frame instead.
	CodeAuthRequired Code = "auth_required"
	// CodeInternalError: the gateway failed (a dependency is down, a bug was
	// caught); the client may retry.
	CodeInternalError Code = "internal_error"
)

// Error is an error frame. Fatal errors are followed by close 1008 with the
// code as the close reason.
type Error struct {
	Code    Code
	Message string
	Fatal   bool
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf-free constructors keep call sites short and the fatal flag explicit.

// NewError returns a non-fatal error frame.
func NewError(code Code, msg string) *Error { return &Error{Code: code, Message: msg} }

// NewFatal returns a fatal error frame.
func NewFatal(code Code, msg string) *Error { return &Error{Code: code, Message: msg, Fatal: true} }
