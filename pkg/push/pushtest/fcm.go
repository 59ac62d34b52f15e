package pushtest

// FCM stands in for Firebase Cloud Messaging's HTTP v1 API and for the
// Google OAuth2 token endpoint a service account's key file names as its
// token_uri. What it copies, from the libraries' source and doc comments
// in the module cache (the web pages they point to could not be read):
//
//   - The token endpoint: the JWT bearer grant (RFC 7523) as
//     golang.org/x/oauth2 v0.37.0 makes it for a Google service account
//     (jwt/jwt.go: a form POST of grant_type
//     urn:ietf:params:oauth:grant-type:jwt-bearer and the assertion, an
//     RS256 JWT whose header kid is the key file's private_key_id;
//     jws/jws.go: the claims iss, the service account's client_email,
//     scope, aud, the token_uri, iat and exp, at most an hour later;
//     google/google.go: token_uri defaults to
//     https://oauth2.googleapis.com/token), and the answer oauth2 reads
//     (access_token, token_type, expires_in; a refusal as 400 with error
//     and error_description, internal/token.go).
//   - The send: POST /v1/projects/{project}/messages:send with
//     Authorization: Bearer <access token>, its body a SendMessageRequest
//     of the discovery document fcm:v1 revision 20261023
//     (google.golang.org/api v0.316.0, fcm/v1/fcm-api.json and
//     fcm-gen.go): message with exactly one of token, topic, condition;
//     android.priority NORMAL or HIGH; android.ttl a Duration ("86400s",
//     at most 4 weeks); data keys none of the reserved words. Members are
//     taken by their JSON names in the document (lowerCamelCase; the API
//     also takes the proto names, which the gateway does not send); an
//     unknown member is refused with INVALID_ARGUMENT, as the API does.
//     Success is 200 {"name": "projects/{project}/messages/{id}"}.
//   - Errors: google.rpc.Status, {"error": {"code", "message", "status",
//     "details": [{"@type":
//     "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode"}]}},
//     as firebase.google.com/go/v4 v4.22.0 reads them (messaging/messaging.go
//     and its tests): UNREGISTERED (404 NOT_FOUND) for a token that is no
//     longer valid, QUOTA_EXCEEDED (429 RESOURCE_EXHAUSTED) with a
//     Retry-After its HTTP client honours (internal/http_client.go),
//     UNAUTHENTICATED (401) for an access token it did not issue.

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FCMScope is the scope the send needs.
const FCMScope = "https://www.googleapis.com/auth/firebase.messaging"

// FCM is the stand-in; NewFCM starts it.
type FCM struct {
	*httptest.Server
	Project      string
	ClientEmail  string
	PrivateKeyID string
	Key          *rsa.PrivateKey

	mu         sync.Mutex
	issued     map[string]time.Time // access tokens and when they expire
	exchanges  int
	sends      []FCMSend // every send request, answered or not
	dead       map[string]bool
	throttle   int // sends answered 429 still to come
	retryAfter string
}

// FCMSend is a send request the stand-in received.
type FCMSend struct {
	At      time.Time
	Header  http.Header
	Body    []byte
	Request FCMSendRequest // as decoded
	Status  int            // how it was answered
}

// FCMSendRequest is the send's body (SendMessageRequest).
type FCMSendRequest struct {
	Message      *FCMMessage `json:"message"`
	ValidateOnly bool        `json:"validateOnly"`
}

// FCMMessage is Message, with the members a wake-up may use.
type FCMMessage struct {
	Token        string            `json:"token"`
	Topic        string            `json:"topic"`
	Condition    string            `json:"condition"`
	Notification *FCMNotification  `json:"notification"`
	Data         map[string]string `json:"data"`
	Android      *FCMAndroid       `json:"android"`
	Apns         *FCMApns          `json:"apns"`
	Webpush      json.RawMessage   `json:"webpush"`
	FcmOptions   json.RawMessage   `json:"fcmOptions"`
}

// FCMNotification is Notification.
type FCMNotification struct {
	Title string `json:"title"`
	Body  string `json:"body"`
	Image string `json:"image"`
}

// FCMAndroid is AndroidConfig.
type FCMAndroid struct {
	CollapseKey           string            `json:"collapseKey"`
	Priority              string            `json:"priority"`
	TTL                   string            `json:"ttl"`
	RestrictedPackageName string            `json:"restrictedPackageName"`
	Data                  map[string]string `json:"data"`
	Notification          map[string]any    `json:"notification"`
	FcmOptions            json.RawMessage   `json:"fcmOptions"`
	DirectBootOk          bool              `json:"directBootOk"`
}

// FCMApns is ApnsConfig.
type FCMApns struct {
	Headers    map[string]string `json:"headers"`
	Payload    map[string]any    `json:"payload"`
	FcmOptions json.RawMessage   `json:"fcmOptions"`
}

// NewFCM starts the stand-in on loopback (plain HTTP: the gateway is
// pointed at its URL); it stops when the test ends.
func NewFCM(t testing.TB) *FCM {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	f := &FCM{
		Project:      "hermes-test-" + randHex(3),
		ClientEmail:  "firebase-adminsdk@hermes-test.iam.gserviceaccount.com",
		PrivateKeyID: randHex(20),
		Key:          key,
		issued:       make(map[string]time.Time),
		dead:         make(map[string]bool),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", f.token)
	mux.HandleFunc("POST /v1/projects/{project}/messages:send", f.send)
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TokenURI is the token endpoint, the key file's token_uri.
func (f *FCM) TokenURI() string { return f.URL + "/token" }

// Credentials is the service account's key file, as the Firebase console
// hands it out, pointing at this stand-in's token endpoint.
func (f *FCM) Credentials() []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(f.Key)
	b, _ := json.MarshalIndent(map[string]string{
		"type":                        "service_account",
		"project_id":                  f.Project,
		"private_key_id":              f.PrivateKeyID,
		"private_key":                 string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":                f.ClientEmail,
		"client_id":                   "100000000000000000000",
		"auth_uri":                    "https://accounts.google.com/o/oauth2/auth",
		"token_uri":                   f.TokenURI(),
		"auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
		"client_x509_cert_url":        "https://www.googleapis.com/robot/v1/metadata/x509/firebase-adminsdk",
		"universe_domain":             "googleapis.com",
	}, "", "  ")
	return b
}

// Unregister makes token dead: its sends are answered 404 UNREGISTERED.
func (f *FCM) Unregister(token string) {
	f.mu.Lock()
	f.dead[token] = true
	f.mu.Unlock()
}

// Throttle answers the next n sends 429 QUOTA_EXCEEDED with Retry-After
// retryAfter (none when empty).
func (f *FCM) Throttle(n int, retryAfter string) {
	f.mu.Lock()
	f.throttle, f.retryAfter = n, retryAfter
	f.mu.Unlock()
}

// RevokeTokens forgets every access token issued: the next send with one
// is answered 401, as after a token's revocation.
func (f *FCM) RevokeTokens() {
	f.mu.Lock()
	clear(f.issued)
	f.mu.Unlock()
}

// Sends are the send requests received so far.
func (f *FCM) Sends() []FCMSend {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]FCMSend(nil), f.sends...)
}

// Delivered are the sends answered 200, in order.
func (f *FCM) Delivered() []FCMSend {
	var out []FCMSend
	for _, s := range f.Sends() {
		if s.Status == http.StatusOK {
			out = append(out, s)
		}
	}
	return out
}

// Exchanges is how many access tokens were issued.
func (f *FCM) Exchanges() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exchanges
}

// token is the token endpoint: the JWT bearer grant.
func (f *FCM) token(w http.ResponseWriter, r *http.Request) {
	refuse := func(code, desc string) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
	}
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		refuse("invalid_request", "the request is not a form")
		return
	}
	if err := r.ParseForm(); err != nil {
		refuse("invalid_request", "the form does not parse")
		return
	}
	if g := r.PostForm.Get("grant_type"); g != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		refuse("unsupported_grant_type", "Invalid grant_type: "+g)
		return
	}
	var h struct{ Alg, Typ, Kid string }
	var c struct {
		Iss, Scope, Aud, Sub string
		Iat, Exp             int64
	}
	signed, sig, err := jwtParts(r.PostForm.Get("assertion"), &h, &c)
	switch {
	case err != nil:
		refuse("invalid_grant", "Invalid JWT: "+err.Error())
		return
	case h.Alg != "RS256" || h.Kid != f.PrivateKeyID:
		refuse("invalid_grant", "Invalid JWT Signature.")
		return
	case !verifyRS256(&f.Key.PublicKey, signed, sig):
		refuse("invalid_grant", "Invalid JWT Signature.")
		return
	case c.Iss != f.ClientEmail:
		refuse("invalid_grant", "Invalid grant: account not found")
		return
	case c.Aud != f.TokenURI():
		refuse("invalid_grant", "Invalid JWT: Failed audience check.")
		return
	case !strings.Contains(" "+c.Scope+" ", " "+FCMScope+" "):
		refuse("invalid_scope", "the assertion does not ask for "+FCMScope)
		return
	}
	now := time.Now().Unix()
	if c.Iat > now+60 || c.Exp < now || c.Exp-c.Iat > 3600 {
		refuse("invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.")
		return
	}
	tok := "ya29.stand-in-" + randHex(16)
	f.mu.Lock()
	f.issued[tok] = time.Now().Add(time.Hour)
	f.exchanges++
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "expires_in": 3599, "token_type": "Bearer"})
}

var durationRE = regexp.MustCompile(`^[0-9]+(\.[0-9]{1,9})?s$`)

// send is messages:send.
func (f *FCM) send(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	rec := FCMSend{At: time.Now(), Header: r.Header.Clone(), Body: body}
	answer := func(code int, status, msg, errorCode string, header http.Header) {
		rec.Status = code
		f.mu.Lock()
		f.sends = append(f.sends, rec)
		f.mu.Unlock()
		for k, v := range header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		w.WriteHeader(code)
		if code == http.StatusOK {
			_ = json.NewEncoder(w).Encode(map[string]string{"name": "projects/" + f.Project + "/messages/0:" + randHex(8)})
			return
		}
		e := map[string]any{"code": code, "message": msg, "status": status}
		if errorCode != "" {
			e["details"] = []map[string]string{{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": errorCode}}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"error": e})
	}
	bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	f.mu.Lock()
	exp, issued := f.issued[bearer]
	f.mu.Unlock()
	if !ok || !issued || time.Now().After(exp) {
		answer(http.StatusUnauthorized, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.", "", nil)
		return
	}
	if p := r.PathValue("project"); p != f.Project {
		answer(http.StatusForbidden, "PERMISSION_DENIED", "Permission 'cloudmessaging.messages.create' denied on resource '//cloudresourcemanager.googleapis.com/projects/"+p+"'", "SENDER_ID_MISMATCH", nil)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		answer(http.StatusBadRequest, "INVALID_ARGUMENT", "Invalid JSON payload received: not application/json.", "INVALID_ARGUMENT", nil)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec.Request); err != nil {
		answer(http.StatusBadRequest, "INVALID_ARGUMENT", "Invalid JSON payload received. "+err.Error(), "INVALID_ARGUMENT", nil)
		return
	}
	if msg := checkMessage(rec.Request.Message); msg != "" {
		answer(http.StatusBadRequest, "INVALID_ARGUMENT", msg, "INVALID_ARGUMENT", nil)
		return
	}
	f.mu.Lock()
	dead, throttled := f.dead[rec.Request.Message.Token], f.throttle > 0
	if throttled {
		f.throttle--
	}
	retryAfter := f.retryAfter
	f.mu.Unlock()
	switch {
	case throttled:
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		answer(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Send requests'.", "QUOTA_EXCEEDED", h)
	case dead:
		answer(http.StatusNotFound, "NOT_FOUND", "Requested entity was not found.", "UNREGISTERED", nil)
	default:
		answer(http.StatusOK, "", "", "", nil)
	}
}

// checkMessage is what the API refuses in a message; "" when nothing.
func checkMessage(m *FCMMessage) string {
	if m == nil {
		return "Message is required."
	}
	targets := 0
	for _, s := range []string{m.Token, m.Topic, m.Condition} {
		if s != "" {
			targets++
		}
	}
	if targets != 1 {
		return "Exactly one of message.token, message.topic or message.condition must be specified."
	}
	for k := range m.Data {
		if k == "from" || k == "message_type" || strings.HasPrefix(k, "google.") || strings.HasPrefix(k, "gcm.") {
			return fmt.Sprintf("Invalid data payload key: %s", k)
		}
	}
	if a := m.Android; a != nil {
		switch a.Priority {
		case "", "NORMAL", "HIGH":
		default:
			return fmt.Sprintf("Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), %q", a.Priority)
		}
		if a.TTL != "" {
			if !durationRE.MatchString(a.TTL) {
				return fmt.Sprintf("Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), %q", a.TTL)
			}
			secs, _ := strconv.ParseFloat(strings.TrimSuffix(a.TTL, "s"), 64)
			if secs > 4*7*24*3600 {
				return "message.android.ttl: the maximum time to live is 4 weeks"
			}
		}
	}
	return ""
}
