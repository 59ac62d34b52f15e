package pushtest

// APNs stands in for the Apple Push Notification service's provider API
// with token-based authentication. What it copies, from
// github.com/sideshow/apns2 v0.25.0's source and doc comments in the
// module cache (Apple's pages they cite could not be read):
//
//   - HTTP/2 over TLS only (client.go: an http2.Transport, hosts
//     https://api.push.apple.com and https://api.sandbox.push.apple.com);
//     a request that is not HTTP/2 is refused.
//   - POST /3/device/<device token, hex> (client.go); another method is
//     405 MethodNotAllowed, another path 404 BadPath (response.go).
//   - The headers (client.go setHeaders, notification.go): authorization
//     "bearer <provider token>"; apns-topic, the bundle id; apns-push-type
//     (alert, background, location, voip, complication, fileprovider, mdm,
//     liveactivity, pushtotalk); apns-priority 5 or 10; apns-expiration a
//     UNIX time in seconds; apns-collapse-id at most 64 bytes; apns-id a
//     UUID.
//   - The provider token (token/token.go): a JWT signed ES256 with the
//     team's .p8 key, header kid the key id, claims iss the team id and
//     iat, taken for an hour (TokenTimeout renews it after 50 minutes).
//   - The answers (response.go): 200 with an apns-id header; errors as
//     {"reason": …} with 400 BadCollapseId, BadDeviceToken,
//     BadExpirationDate, BadPriority, BadTopic, DeviceTokenNotForTopic,
//     InvalidPushType, MissingDeviceToken, MissingTopic, PayloadEmpty;
//     403 ExpiredProviderToken, InvalidProviderToken,
//     MissingProviderToken; 410 Unregistered with "timestamp", the last
//     time APNs knew the token invalid (milliseconds); 429
//     TooManyRequests.
//   - The payload (payload/builder.go): a JSON object with the aps
//     dictionary.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
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

// APNs is the stand-in; NewAPNs starts it.
type APNs struct {
	*httptest.Server
	Key    *ecdsa.PrivateKey
	KeyID  string
	TeamID string
	Topic  string

	mu         sync.Mutex
	requests   []APNsRequest
	dead       map[string]string // token → its reason: Unregistered (410) or BadDeviceToken (400)
	throttle   int
	retryAfter string
	expire     int // provider tokens still to be refused as expired
}

// APNsRequest is a request the stand-in received.
type APNsRequest struct {
	At      time.Time
	Proto   string
	Token   string // the device token of the path
	Header  http.Header
	Payload map[string]any
	Body    []byte
	Status  int
	Reason  string
}

// NewAPNs starts the stand-in: HTTP/2 over TLS on loopback with a test
// certificate (CertPool, CertPEM); it stops when the test ends.
func NewAPNs(t testing.TB) *APNs {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a := &APNs{
		Key:    key,
		KeyID:  strings.ToUpper(randHex(5)),
		TeamID: strings.ToUpper(randHex(5)),
		Topic:  "org.hermes.mobile.test",
		dead:   make(map[string]string),
	}
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	a.EnableHTTP2 = true
	a.StartTLS()
	t.Cleanup(a.Close)
	return a
}

// KeyP8 is the .p8 file of the team's key: a PKCS #8 P-256 key in PEM.
func (a *APNs) KeyP8() []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(a.Key)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// CertPool trusts the stand-in's certificate.
func (a *APNs) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(a.Certificate())
	return p
}

// CertPEM is the stand-in's certificate in PEM, for SSL_CERT_FILE.
func (a *APNs) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Certificate().Raw})
}

// Unregister makes token dead: answered 410 Unregistered.
func (a *APNs) Unregister(token string) { a.setDead(token, "Unregistered") }

// BadToken makes token one APNs does not know (another environment's):
// answered 400 BadDeviceToken.
func (a *APNs) BadToken(token string) { a.setDead(token, "BadDeviceToken") }

func (a *APNs) setDead(token, reason string) {
	a.mu.Lock()
	a.dead[token] = reason
	a.mu.Unlock()
}

// Throttle answers the next n requests 429 TooManyRequests, with
// Retry-After retryAfter when not empty.
func (a *APNs) Throttle(n int, retryAfter string) {
	a.mu.Lock()
	a.throttle, a.retryAfter = n, retryAfter
	a.mu.Unlock()
}

// ExpireProviderTokens refuses the provider token of the next n requests
// as 403 ExpiredProviderToken.
func (a *APNs) ExpireProviderTokens(n int) {
	a.mu.Lock()
	a.expire = n
	a.mu.Unlock()
}

// Requests are the requests received so far.
func (a *APNs) Requests() []APNsRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]APNsRequest(nil), a.requests...)
}

// Delivered are the requests answered 200, in order.
func (a *APNs) Delivered() []APNsRequest {
	var out []APNsRequest
	for _, r := range a.Requests() {
		if r.Status == http.StatusOK {
			out = append(out, r)
		}
	}
	return out
}

var (
	hexToken  = regexp.MustCompile(`^[0-9a-fA-F]+$`)
	pushTypes = map[string]bool{"alert": true, "background": true, "location": true, "voip": true, "complication": true,
		"fileprovider": true, "mdm": true, "liveactivity": true, "pushtotalk": true}
)

func (a *APNs) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	rec := APNsRequest{At: time.Now(), Proto: r.Proto, Header: r.Header.Clone(), Body: body}
	answer := func(code int, reason string) {
		rec.Status, rec.Reason = code, reason
		a.mu.Lock()
		a.requests = append(a.requests, rec)
		a.mu.Unlock()
		w.Header().Set("apns-id", "7C8E2B46-"+strings.ToUpper(randHex(2))+"-"+strings.ToUpper(randHex(2))+"-"+strings.ToUpper(randHex(2))+"-"+strings.ToUpper(randHex(6)))
		if code == http.StatusOK {
			w.WriteHeader(code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		m := map[string]any{"reason": reason}
		if code == http.StatusGone {
			m["timestamp"] = time.Now().Add(-time.Hour).UnixMilli()
		}
		_ = json.NewEncoder(w).Encode(m)
	}
	if r.ProtoMajor != 2 {
		answer(http.StatusBadRequest, "ProtocolNotHTTP2") // the stand-in's reason: APNs speaks nothing else
		return
	}
	if r.Method != http.MethodPost {
		answer(http.StatusMethodNotAllowed, "MethodNotAllowed")
		return
	}
	token, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
	rec.Token = token
	switch {
	case !ok:
		answer(http.StatusNotFound, "BadPath")
		return
	case token == "":
		answer(http.StatusBadRequest, "MissingDeviceToken")
		return
	}
	// The provider token.
	bearer, ok := strings.CutPrefix(r.Header.Get("authorization"), "bearer ")
	if !ok || bearer == "" {
		answer(http.StatusForbidden, "MissingProviderToken")
		return
	}
	var h struct{ Alg, Kid string }
	var c struct {
		Iss string
		Iat int64
	}
	signed, sig, err := jwtParts(bearer, &h, &c)
	if err != nil || h.Alg != "ES256" || h.Kid != a.KeyID || c.Iss != a.TeamID || !verifyES256(&a.Key.PublicKey, signed, sig) {
		answer(http.StatusForbidden, "InvalidProviderToken")
		return
	}
	a.mu.Lock()
	expire := a.expire > 0
	if expire {
		a.expire--
	}
	a.mu.Unlock()
	if now := time.Now().Unix(); expire || c.Iat < now-3600 || c.Iat > now+60 {
		answer(http.StatusForbidden, "ExpiredProviderToken")
		return
	}
	// The headers.
	hd := r.Header
	if hd.Get("apns-topic") == "" {
		answer(http.StatusBadRequest, "MissingTopic")
		return
	}
	if hd.Get("apns-topic") != a.Topic {
		answer(http.StatusBadRequest, "BadTopic")
		return
	}
	if pt := hd.Get("apns-push-type"); pt != "" && !pushTypes[pt] {
		answer(http.StatusBadRequest, "InvalidPushType")
		return
	}
	if p := hd.Get("apns-priority"); p != "" && p != "5" && p != "10" {
		answer(http.StatusBadRequest, "BadPriority")
		return
	}
	if e := hd.Get("apns-expiration"); e != "" {
		if _, err := strconv.ParseInt(e, 10, 64); err != nil {
			answer(http.StatusBadRequest, "BadExpirationDate")
			return
		}
	}
	if len(hd.Get("apns-collapse-id")) > 64 {
		answer(http.StatusBadRequest, "BadCollapseId")
		return
	}
	if len(body) == 0 {
		answer(http.StatusBadRequest, "PayloadEmpty")
		return
	}
	if err := json.Unmarshal(body, &rec.Payload); err != nil || rec.Payload["aps"] == nil {
		answer(http.StatusBadRequest, "BadPayload") // the stand-in's reason: apns2 lists none for it
		return
	}
	if !hexToken.MatchString(token) {
		answer(http.StatusBadRequest, "BadDeviceToken")
		return
	}
	a.mu.Lock()
	dead := a.dead[token]
	throttled := a.throttle > 0
	if throttled {
		a.throttle--
	}
	retryAfter := a.retryAfter
	a.mu.Unlock()
	switch {
	case throttled:
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		answer(http.StatusTooManyRequests, "TooManyRequests")
	case dead == "Unregistered":
		answer(http.StatusGone, dead)
	case dead != "":
		answer(http.StatusBadRequest, dead)
	default:
		answer(http.StatusOK, "")
	}
}
