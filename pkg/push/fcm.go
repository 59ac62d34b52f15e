package push

// Firebase Cloud Messaging, the HTTP v1 API: one POST per notification to
// <root>/v1/projects/<project>/messages:send with an OAuth2 access token
// of a service account, which golang.org/x/oauth2/google gets by the JWT
// bearer grant from the key file's token_uri. The request's shape is the
// API's discovery document, fcm:v1 revision 20261023, as
// google.golang.org/api/fcm/v1 (v0.316.0) carries it (fcm-api.json,
// fcm-gen.go: SendMessageRequest, Message, AndroidConfig,
// AndroidNotification, ApnsConfig); its error details, the FcmError
// errorCode UNREGISTERED of a dead token, are those
// firebase.google.com/go/v4 (v4.22.0, messaging/messaging.go) reads.
//
// Neither Google client is used: firebase.google.com/go/v4 brings the
// Admin SDK's every service and transport, google.golang.org/api a
// generated client whose transport and retries would have to be taken
// apart again, while a notification here must go through the Notifier's
// dialer (its address policy), slots and retries, and tests must point
// the token exchange and the send at a loopback stand-in
// (pushtest.FCM): the request is a small JSON body.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"golang.org/x/oauth2/jwt"

	"github.com/hermes-mobile/gateway/internal/retry"
)

const (
	// FCMURL is FCM's root: a notification is a POST to
	// <root>/v1/projects/<project>/messages:send.
	FCMURL = "https://fcm.googleapis.com"
	// FCMScope is the OAuth2 scope of FCM's send.
	FCMScope = "https://www.googleapis.com/auth/firebase.messaging"
	// fcmUnregistered is FCM's errorCode of a registration token that
	// is no longer valid (the app was uninstalled, its token renewed).
	fcmUnregistered = "UNREGISTERED"
	fcmErrorType    = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
)

// Notification text shared by FCM and APNs.
const (
	alertTitle = "Hermes"
	// genericAlert is what a notification says without Config.Content.
	genericAlert = "Hermes has something for you"
	// collapseKey makes a burst one notification on the phone: FCM's
	// android.collapseKey and notification tag, APNs's apns-collapse-id
	// and thread-id.
	collapseKey = "hermes"
	// maxAlertBytes bounds a waiting message's text in a notification
	// (Config.Content): both services take 4 KiB of payload.
	maxAlertBytes = 1024
)

// alert is the text a notification shows for nt: the message's text (cut
// to maxAlertBytes) when Config.Content put it in nt, else genericAlert.
func alert(nt Notice) string {
	if nt.Text == "" {
		return genericAlert
	}
	if len(nt.Text) <= maxAlertBytes {
		return nt.Text
	}
	cut := maxAlertBytes - len("…")
	for cut > 0 && nt.Text[cut]&0xC0 == 0x80 { // not inside a character
		cut--
	}
	return nt.Text[:cut] + "…"
}

// FCMConfig configures Firebase Cloud Messaging.
type FCMConfig struct {
	// Credentials is a Firebase service account's JSON key file, as the
	// Firebase console hands it out (Project settings, Service accounts,
	// Generate new private key): its client_email, private_key and
	// token_uri get the access tokens, its project_id names the project.
	Credentials []byte
	// Project is the Firebase project id, when not the file's project_id.
	Project string
	// URL is FCM's root (FCMURL); another for a relay or a test's
	// stand-in. The Policy judges its address as it does every endpoint's.
	URL string
}

// FCM is an FCMConfig that LoadFCM checked.
type FCM struct {
	jwt     *jwt.Config
	project string
	sendURL string
	origin  string
}

// LoadFCM checks c: a service account's key file whose private key
// parses, a project, URLs that can be requested. Its errors never quote
// the file.
func LoadFCM(c FCMConfig) (*FCM, error) {
	var f struct {
		Type        string `json:"type"`
		ProjectID   string `json:"project_id"`
		ClientEmail string `json:"client_email"`
		PrivateKey  string `json:"private_key"`
		TokenURI    string `json:"token_uri"`
	}
	if err := json.Unmarshal(c.Credentials, &f); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, fmt.Errorf("the service account key file is not JSON (at byte %d)", syn.Offset)
		}
		return nil, errors.New("the service account key file is not a JSON object of a service account key")
	}
	if f.Type != "service_account" {
		return nil, fmt.Errorf("the key file's type is %q, not service_account: use a service account's key (Firebase console, Project settings, Service accounts)", f.Type)
	}
	if f.ClientEmail == "" {
		return nil, errors.New("the service account key file has no client_email")
	}
	if err := rsaKey(f.PrivateKey); err != nil {
		return nil, fmt.Errorf("the service account key file's private_key: %w", err)
	}
	if f.TokenURI != "" {
		if err := httpURL(f.TokenURI); err != nil {
			return nil, fmt.Errorf("the service account key file's token_uri: %w", err)
		}
	}
	project := cmp.Or(c.Project, f.ProjectID)
	if project == "" {
		return nil, errors.New("no project: the key file has no project_id, and none is set")
	}
	if strings.ContainsAny(project, "/?# ") || len(project) > 128 {
		return nil, fmt.Errorf("project %q is not a Firebase project id", project)
	}
	root := strings.TrimSuffix(cmp.Or(c.URL, FCMURL), "/")
	if err := httpURL(root); err != nil {
		return nil, fmt.Errorf("FCM's url: %w", err)
	}
	conf, err := google.JWTConfigFromJSON(c.Credentials, FCMScope)
	if err != nil {
		return nil, errors.New("the service account key file is not a service account key")
	}
	u, _ := url.Parse(root)
	return &FCM{
		jwt:     conf,
		project: project,
		sendURL: root + "/v1/projects/" + url.PathEscape(project) + "/messages:send",
		origin:  origin(u),
	}, nil
}

// Project is the Firebase project notifications are sent in.
func (f *FCM) Project() string { return f.project }

// rsaKey checks a service account's private key: an RSA key in PEM,
// PKCS #8 (what Google hands out) or PKCS #1.
func rsaKey(s string) error {
	block, _ := pem.Decode([]byte(s))
	if block == nil {
		return errors.New("not a PEM private key")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		if _, ok := k.(*rsa.PrivateKey); !ok {
			return errors.New("not an RSA key")
		}
		return nil
	}
	if _, err := x509.ParsePKCS1PrivateKey(block.Bytes); err != nil {
		return errors.New("not an RSA private key in PKCS #8 or PKCS #1")
	}
	return nil
}

// httpURL checks a configured URL: absolute http(s), a host, no
// credentials.
func httpURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return fmt.Errorf("%q is not an absolute http or https URL without credentials", s)
	}
	return nil
}

// fcmSender sends FCM's notifications for a Notifier: its access tokens
// are fetched through the Notifier's transport (the policy's dialer).
type fcmSender struct {
	f   *FCM
	ttl time.Duration
	ctx context.Context // carries the token exchange's HTTP client

	mu  sync.Mutex
	src oauth2.TokenSource // caches the access token until it nearly expires
}

func newFCMSender(f *FCM, n *Notifier) *fcmSender {
	hc := &http.Client{
		Transport:     n.transport,
		Timeout:       n.cfg.Timeout,
		CheckRedirect: n.client.CheckRedirect,
	}
	s := &fcmSender{f: f, ttl: n.cfg.TTL, ctx: context.WithValue(context.Background(), oauth2.HTTPClient, hc)}
	s.src = f.jwt.TokenSource(s.ctx)
	return s
}

func (s *fcmSender) endpoint() string { return s.f.origin }

// renew drops the cached access token: FCM refused it (401).
func (s *fcmSender) renew() {
	s.mu.Lock()
	s.src = s.f.jwt.TokenSource(s.ctx)
	s.mu.Unlock()
}

// FCM's send request (SendMessageRequest), as much of it as a wake-up
// needs.
type fcmSendRequest struct {
	Message fcmMessage `json:"message"`
}

type fcmMessage struct {
	Token        string            `json:"token"`
	Notification fcmNotification   `json:"notification"`
	Data         map[string]string `json:"data"`
	Android      fcmAndroid        `json:"android"`
	// APNs is for an app that gets its notifications on iOS through
	// FCM (Firebase's iOS SDK) and registers as fcm: the same collapse,
	// expiry and priority as the apns kind's.
	APNs fcmAPNs `json:"apns"`
}

type fcmNotification struct {
	Title string `json:"title"`
	Body  string `json:"body"`
}

type fcmAndroid struct {
	CollapseKey  string                 `json:"collapseKey"`
	Priority     string                 `json:"priority"` // HIGH: wake the phone now
	TTL          string                 `json:"ttl"`      // a Duration: "86400s"
	Notification fcmAndroidNotification `json:"notification"`
}

type fcmAndroidNotification struct {
	Tag string `json:"tag"` // replaces a shown notification of the same tag
}

type fcmAPNs struct {
	Headers map[string]string `json:"headers"`
}

func (s *fcmSender) request(ctx context.Context, token string, nt Notice) (*http.Request, outcome) {
	s.mu.Lock()
	src := s.src
	s.mu.Unlock()
	tok, err := src.Token()
	if err != nil {
		return nil, tokenOutcome(err)
	}
	ttl := int64(s.ttl / time.Second)
	m := fcmSendRequest{Message: fcmMessage{
		Token:        token,
		Notification: fcmNotification{Title: alertTitle, Body: alert(nt)},
		Data:         map[string]string{"device": nt.public().Device, "what": nt.What},
		Android: fcmAndroid{
			CollapseKey:  collapseKey,
			Priority:     "HIGH",
			TTL:          strconv.FormatInt(ttl, 10) + "s",
			Notification: fcmAndroidNotification{Tag: collapseKey},
		},
		APNs: fcmAPNs{Headers: map[string]string{
			"apns-collapse-id": collapseKey,
			"apns-expiration":  strconv.FormatInt(nt.At.Add(s.ttl).Unix(), 10),
			"apns-priority":    "10",
			"apns-push-type":   "alert",
		}},
	}}
	body, _ := json.Marshal(m)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.f.sendURL, bytes.NewReader(body))
	if err != nil {
		return nil, outcome{err: errors.New("FCM's url cannot be requested"), permanent: true}
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	return req, outcome{}
}

// tokenOutcome is what a failed token exchange means: the token endpoint
// refused the service account (a 4xx but 408 and 429: its key revoked, the
// file's client_email unknown) for good, anything else for a retry.
func tokenOutcome(err error) outcome {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.Response == nil {
		// The exchange did not get an answer; the error names the
		// token_uri, which is no secret.
		return outcome{err: fmt.Errorf("fetching FCM's access token: %w", err)}
	}
	code := re.Response.StatusCode
	// The refusal's error and error_description (RFC 6749 section 5.2):
	// the jwt package leaves them in the body.
	var e struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	_ = json.Unmarshal(re.Body, &e)
	o := outcome{err: fmt.Errorf("the token endpoint answered %d %s (%s: %s)", code, http.StatusText(code),
		cmp.Or(e.Error, re.ErrorCode), cmp.Or(e.Description, re.ErrorDescription))}
	switch {
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		o.retryAfter, o.hasRetryAfter = retry.RetryAfter(re.Response.Header.Get("Retry-After"), time.Now())
	case code == http.StatusRequestTimeout || code >= 500:
	default:
		o.permanent = true
	}
	return o
}

// fcmError is FCM's error answer: google.rpc.Status with FcmError
// details.
type fcmError struct {
	Error struct {
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []struct {
			Type      string `json:"@type"`
			ErrorCode string `json:"errorCode"`
		} `json:"details"`
	} `json:"error"`
}

// answer: UNREGISTERED is a dead token (404 as FCM sends it, whatever the
// status: a 404 without it may be a wrong project and forgets nothing); a
// 401 is an access token FCM no longer takes, renewed for the retry.
func (s *fcmSender) answer(resp *http.Response, body []byte, o outcome) outcome {
	var e fcmError
	_ = json.Unmarshal(body, &e)
	code := e.Error.Status
	for _, d := range e.Error.Details {
		if d.Type == fcmErrorType && d.ErrorCode != "" {
			code = d.ErrorCode
		}
	}
	if code != "" || e.Error.Message != "" {
		o.err = fmt.Errorf("%w (%s: %s)", o.err, code, e.Error.Message)
	}
	switch {
	case code == fcmUnregistered:
		o.dead, o.permanent = true, true
	case resp.StatusCode == http.StatusUnauthorized:
		s.renew()
		o.permanent = false
	}
	return o
}
