package dispatch_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/push/pushtest"
	"github.com/hermes-mobile/gateway/pkg/secret"
)

// pushServices are settings that turn FCM and APNs on, with the stand-ins'
// credentials (nothing is sent to them here).
func pushServices(t *testing.T) dispatch.PushServices {
	f, a := pushtest.NewFCM(t), pushtest.NewAPNs(t)
	return dispatch.PushServices{
		FCMCredentials: secret.Secret(f.Credentials()),
		APNsKey:        secret.Secret(a.KeyP8()), APNsKeyID: a.KeyID, APNsTeamID: a.TeamID, APNsTopic: a.Topic,
	}
}

// TestPushServicesSettings: each secret comes from its variable or its
// file, not both; a service's other settings without its secret, a
// missing id, a bad environment or URL, and a key that does not parse
// stop the process, each naming its variable and quoting no secret.
func TestPushServicesSettings(t *testing.T) {
	good := pushServices(t)
	dir := t.TempDir()
	credsFile, keyFile := filepath.Join(dir, "fcm.json"), filepath.Join(dir, "apns.p8")
	if os.WriteFile(credsFile, []byte(good.FCMCredentials), 0o600) != nil || os.WriteFile(keyFile, []byte(good.APNsKey), 0o600) != nil {
		t.Fatal("writing the key files")
	}
	fromFiles := good
	fromFiles.FCMCredentials, fromFiles.FCMCredentialsFile = "", credsFile
	fromFiles.APNsKey, fromFiles.APNsKeyFile = "", keyFile
	for name, p := range map[string]dispatch.PushServices{"variables": good, "files": fromFiles, "none": {}} {
		if err := (dispatch.OutboxConfig{PushServices: p}).Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, tc := range map[string]struct {
		mod  func(*dispatch.PushServices)
		want string
	}{
		"both FCM's":        {func(p *dispatch.PushServices) { p.FCMCredentialsFile = credsFile }, "MOBILE_PUSH_FCM_CREDENTIALS_FILE: MOBILE_PUSH_FCM_CREDENTIALS is set too"},
		"no such file":      {func(p *dispatch.PushServices) { p.APNsKey, p.APNsKeyFile = "", filepath.Join(dir, "none.p8") }, "MOBILE_PUSH_APNS_KEY_FILE: open"},
		"project alone":     {func(p *dispatch.PushServices) { p.FCMCredentials, p.FCMProject = "", "p-1" }, "MOBILE_PUSH_FCM_CREDENTIALS_FILE: not set"},
		"topic alone":       {func(p *dispatch.PushServices) { p.APNsKey = "" }, "MOBILE_PUSH_APNS_KEY_FILE: not set"},
		"no key id":         {func(p *dispatch.PushServices) { p.APNsKeyID = "" }, "MOBILE_PUSH_APNS_KEY_ID: not set"},
		"no team":           {func(p *dispatch.PushServices) { p.APNsTeamID = "" }, "MOBILE_PUSH_APNS_TEAM_ID: not set"},
		"no topic":          {func(p *dispatch.PushServices) { p.APNsTopic = "" }, "MOBILE_PUSH_APNS_TOPIC: not set"},
		"environment":       {func(p *dispatch.PushServices) { p.APNsEnvironment = "prod" }, "MOBILE_PUSH_APNS_ENV"},
		"apns over http":    {func(p *dispatch.PushServices) { p.APNsURL = "http://127.0.0.1:1" }, "MOBILE_PUSH_APNS_URL"},
		"fcm url":           {func(p *dispatch.PushServices) { p.FCMURL = "fcm.example" }, "MOBILE_PUSH_FCM_URL"},
		"a key that is not": {func(p *dispatch.PushServices) { p.APNsKey = secret.Secret(good.FCMCredentials) }, "MOBILE_PUSH_APNS_KEY: "},
		"user credentials": {func(p *dispatch.PushServices) {
			p.FCMCredentials = `{"type":"authorized_user","refresh_token":"PRIVATE KEY"}`
		}, "MOBILE_PUSH_FCM_CREDENTIALS: "},
	} {
		p := good
		tc.mod(&p)
		err := dispatch.OutboxConfig{PushServices: p}.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) && !strings.Contains(err.Error(), "\n"+tc.want) {
			t.Errorf("%s: Validate = %v, want an error beginning %q", name, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), "BEGIN") {
			t.Errorf("%s: the error quotes a secret: %v", name, err)
		}
	}
}

// TestPushServicesFlags: the settings are flags and variables; the
// secrets' values never print (-help's defaults, a flag's String).
func TestPushServicesFlags(t *testing.T) {
	good := pushServices(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "apns.p8")
	if err := os.WriteFile(keyFile, []byte(good.APNsKey), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOBILE_PUSH_FCM_CREDENTIALS", string(good.FCMCredentials))
	t.Setenv("MOBILE_PUSH_APNS_KEY_FILE", keyFile)
	t.Setenv("MOBILE_PUSH_APNS_KEY_ID", good.APNsKeyID)
	t.Setenv("MOBILE_PUSH_APNS_TEAM_ID", good.APNsTeamID)
	t.Setenv("MOBILE_PUSH_APNS_TOPIC", good.APNsTopic)
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	var c dispatch.OutboxConfig
	c.RegisterFlags(fs)
	if err := config.Parse(fs, []string{"-push-apns-env=sandbox"}); err != nil {
		t.Fatal(err)
	}
	p := c.PushServices
	if p.FCMCredentials != good.FCMCredentials || p.APNsKeyFile != keyFile || p.APNsEnvironment != push.APNsSandbox || p.APNsTopic != good.APNsTopic {
		t.Fatalf("parsed %+v", p)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var help strings.Builder
	fs.SetOutput(&help)
	fs.PrintDefaults()
	shown, _ := json.Marshal(p)
	for _, s := range []string{help.String(), fs.Lookup("push-fcm-credentials").Value.String(), string(shown)} {
		if strings.Contains(s, "PRIVATE KEY") || strings.Contains(s, "private_key") {
			t.Fatalf("a secret is printed:\n%s", s)
		}
	}
	for _, name := range []string{"push-fcm-credentials-file", "push-fcm-project", "push-fcm-url", "push-apns-key", "push-apns-key-id",
		"push-apns-team-id", "push-apns-topic", "push-apns-url"} {
		if fs.Lookup(name) == nil {
			t.Errorf("no flag -%s", name)
		}
	}
}
