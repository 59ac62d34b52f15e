package protocol_test

import (
	"encoding/base64"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Every row of the specification's "Constraints and limits" table.
func TestLimitsMatchSpec(t *testing.T) {
	tests := []struct {
		name      string
		got, want int64
	}{
		{"PROTOCOL_VERSION", protocol.Version, 1},
		{"MAX_FRAME_BYTES", protocol.MaxFrameBytes, 16777216},
		{"MAX_TEXT_CHARS", protocol.MaxTextChars, 12000},
		{"MAX_AUDIO_BYTES", protocol.MaxAudioBytes, 8388608},
		{"MAX_MEDIA_BYTES", protocol.MaxMediaBytes, 8388608},
		{"MEDIA_CHUNK_BYTES", protocol.MediaChunkBytes, 3145728},
		{"MIN_MEDIA_CHUNK_BYTES", protocol.MinMediaChunkBytes, 4096},
		{"MAX_MEDIA_PARTS", protocol.MaxMediaParts, 2048},
		{"DEFAULT_CHUNK_LIMIT", protocol.DefaultChunkLimit, 3500},
		{"DEFAULT_PROMPT_TTL", int64(protocol.DefaultPromptTTL), int64(300 * time.Second)},
		{"unfinished uploads", protocol.MaxOpenUploads, 8},
		{"total device buffer", protocol.MaxUploadBufferBytes, 8388608},
		{"hello timeout", int64(protocol.HelloTimeout), int64(15 * time.Second)},
		{"typing idle", int64(protocol.TypingIdle), int64(3 * time.Second)},
		{"close code", protocol.CloseCode, 1008},
		{"dedup window", int64(protocol.DedupWindow), int64(600 * time.Second)},
		{"id truncation", protocol.MaxIDChars, 128},
		{"device field truncation", protocol.MaxDeviceFieldChars, 120},
		{"filename truncation", protocol.MaxFilenameChars, 200},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %d, want %d", tt.name, tt.got, tt.want)
		}
	}
}

// Every row of the specification's "Error codes" table.
func TestErrorCodesMatchSpec(t *testing.T) {
	tests := map[protocol.Code]string{
		protocol.CodeBadFrame:         "bad_frame",
		protocol.CodeAuthFailed:       "auth_failed",
		protocol.CodeForbidden:        "forbidden",
		protocol.CodeUnsupportedFrame: "unsupported_frame",
		protocol.CodeTooBig:           "too_big",
		protocol.CodeDeviceOffline:    "device_offline",
		protocol.CodeAuthRequired:     "auth_required",
		protocol.CodeInternalError:    "internal_error",
	}
	for code, want := range tests {
		if string(code) != want {
			t.Errorf("code %q, want %q", code, want)
		}
	}
	if e := protocol.NewError(protocol.CodeTooBig, "m"); e.Fatal || e.Code != protocol.CodeTooBig || e.Message != "m" {
		t.Errorf("NewError = %+v", e)
	}
	if e := protocol.NewFatal(protocol.CodeAuthFailed, "m"); !e.Fatal || e.Code != protocol.CodeAuthFailed {
		t.Errorf("NewFatal = %+v", e)
	}
	if got := protocol.NewError(protocol.CodeBadFrame, "no t").Error(); got != "bad_frame: no t" {
		t.Errorf("Error() = %q", got)
	}
}

func TestMediaKindsMatchSpec(t *testing.T) {
	if want := []string{"image", "video", "document", "audio"}; !reflect.DeepEqual(protocol.MediaIn, want) {
		t.Errorf("MediaIn = %v, want %v", protocol.MediaIn, want)
	}
	if want := []string{"image", "voice", "video", "document", "animation"}; !reflect.DeepEqual(protocol.MediaOut, want) {
		t.Errorf("MediaOut = %v, want %v", protocol.MediaOut, want)
	}
	tests := []struct {
		kind    string
		in, out bool
	}{
		{"image", true, true},
		{"video", true, true},
		{"document", true, true},
		{"audio", true, false},
		{"voice", false, true},
		{"animation", false, true},
		{"sticker", false, false},
		{"", false, false},
		{"Image", false, false},
	}
	for _, tt := range tests {
		if got := protocol.IsMediaIn(tt.kind); got != tt.in {
			t.Errorf("IsMediaIn(%q) = %v, want %v", tt.kind, got, tt.in)
		}
		if got := protocol.IsMediaOut(tt.kind); got != tt.out {
			t.Errorf("IsMediaOut(%q) = %v, want %v", tt.kind, got, tt.out)
		}
	}
}

func TestAvatarState(t *testing.T) {
	for in, want := range map[string]string{
		"idle": "idle", "thinking": "thinking", "speaking": "speaking",
		"": "idle", "sleeping": "idle", "SPEAKING": "idle",
	} {
		if got := protocol.AvatarState(in); got != want {
			t.Errorf("AvatarState(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSession(t *testing.T) {
	if got := protocol.Session("tel-1"); got != "mobile:tel-1" {
		t.Errorf("Session(tel-1) = %q, want mobile:tel-1", got)
	}
}

// TestTooBigTextsNameTheLimits: the too_big texts are formatted from the
// limits, so they say what a client must stay under.
func TestTooBigTextsNameTheLimits(t *testing.T) {
	if got := protocol.MiB(protocol.MaxMediaBytes); got != "8 MiB" {
		t.Errorf("MiB(MaxMediaBytes) = %q, want 8 MiB", got)
	}
	long := `{"t":"text","id":"1","text":"` + strings.Repeat("x", protocol.MaxTextChars+1) + `"}`
	if _, e := protocol.Decode([]byte(long)); e == nil || e.Error() != "too_big: text is longer than 12000 characters" {
		t.Errorf("a text over the limit: %v", e)
	}
	audio := `{"t":"audio","id":"1","format":"ogg","data":"` + base64.StdEncoding.EncodeToString(make([]byte, protocol.MaxAudioBytes+1)) + `"}`
	if _, e := protocol.Decode([]byte(audio)); e == nil || e.Error() != "too_big: audio is larger than 8 MiB" {
		t.Errorf("audio over the limit: %v", e)
	}
}
