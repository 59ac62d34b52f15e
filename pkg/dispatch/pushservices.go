package dispatch

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/secret"
)

// PushServices configures the services that wake the phones people
// carry: Firebase Cloud Messaging (MOBILE_PUSH_FCM_*) and the Apple Push
// Notification service (MOBILE_PUSH_APNS_*). A service is on when its
// secret is set, either as itself (MOBILE_PUSH_FCM_CREDENTIALS,
// MOBILE_PUSH_APNS_KEY) or as a file that holds it (the _FILE variable),
// not both. Secrets are never printed nor logged. See push.FCMConfig and
// push.APNsConfig.
type PushServices struct {
	// FCMCredentials is a Firebase service account's JSON key;
	// FCMCredentialsFile the file that holds it.
	FCMCredentials     secret.Secret
	FCMCredentialsFile string
	// FCMProject is the Firebase project, when not the key's project_id.
	FCMProject string
	// FCMURL replaces FCM's root, https://fcm.googleapis.com: a relay,
	// or a test's stand-in.
	FCMURL string
	// APNsKey is the team's APNs authentication key, the .p8 file's
	// PEM; APNsKeyFile the .p8 file.
	APNsKey     secret.Secret
	APNsKeyFile string
	// APNsKeyID and APNsTeamID are the key's and the team's ids;
	// APNsTopic the app's bundle id.
	APNsKeyID  string
	APNsTeamID string
	APNsTopic  string
	// APNsEnvironment is production (the default) or sandbox.
	APNsEnvironment string
	// APNsURL replaces the environment's host: a test's stand-in.
	APNsURL string
}

// registerFlags registers the push services' settings on fs.
func (p *PushServices) registerFlags(fs *flag.FlagSet) {
	config.Secret(fs, &p.FCMCredentials, "push-fcm-credentials", "MOBILE_PUSH_FCM_CREDENTIALS", "the JSON key of the Firebase service account that sends FCM notifications (or the file: -push-fcm-credentials-file)")
	config.String(fs, &p.FCMCredentialsFile, "push-fcm-credentials-file", "MOBILE_PUSH_FCM_CREDENTIALS_FILE", "", "the file of the Firebase service account's JSON key; turns FCM notifications on")
	config.String(fs, &p.FCMProject, "push-fcm-project", "MOBILE_PUSH_FCM_PROJECT", "", "the Firebase project; empty: the key's project_id")
	config.String(fs, &p.FCMURL, "push-fcm-url", "MOBILE_PUSH_FCM_URL", "", "FCM's root instead of "+push.FCMURL+" (a relay)")
	config.Secret(fs, &p.APNsKey, "push-apns-key", "MOBILE_PUSH_APNS_KEY", "the APNs authentication key, the .p8 file's contents (or the file: -push-apns-key-file)")
	config.String(fs, &p.APNsKeyFile, "push-apns-key-file", "MOBILE_PUSH_APNS_KEY_FILE", "", "the APNs authentication key's .p8 file; turns APNs notifications on")
	config.String(fs, &p.APNsKeyID, "push-apns-key-id", "MOBILE_PUSH_APNS_KEY_ID", "", "the APNs key's id (10 characters)")
	config.String(fs, &p.APNsTeamID, "push-apns-team-id", "MOBILE_PUSH_APNS_TEAM_ID", "", "the Apple developer team's id")
	config.String(fs, &p.APNsTopic, "push-apns-topic", "MOBILE_PUSH_APNS_TOPIC", "", "the iOS app's bundle id (apns-topic)")
	config.String(fs, &p.APNsEnvironment, "push-apns-env", "MOBILE_PUSH_APNS_ENV", "", "production (empty: the default), or sandbox for apps built from Xcode")
	config.String(fs, &p.APNsURL, "push-apns-url", "MOBILE_PUSH_APNS_URL", "", "APNs's host instead of the environment's (https)")
}

// secretValue is a secret setting's value: the variable's, or its file's.
func secretValue(value secret.Secret, file, name string) ([]byte, error) {
	switch {
	case value != "" && file != "":
		return nil, fmt.Errorf("%s_FILE: %s is set too: give one of them", name, name)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s_FILE: %w", name, err)
		}
		return b, nil
	}
	return []byte(value), nil
}

// load checks the settings and loads the services that are on: nil for
// one that is off. Each error begins with the variable to fix.
func (p PushServices) load() (*push.FCM, *push.APNs, []error) {
	var errs []error
	var fcm *push.FCM
	var apns *push.APNs
	creds, err := secretValue(p.FCMCredentials, p.FCMCredentialsFile, "MOBILE_PUSH_FCM_CREDENTIALS")
	switch {
	case err != nil:
		errs = append(errs, err)
	case len(creds) > 0:
		if p.FCMURL != "" && !httpURL(p.FCMURL, "http", "https") {
			errs = append(errs, fmt.Errorf("MOBILE_PUSH_FCM_URL: %q is not an absolute http or https URL without credentials", p.FCMURL))
			break
		}
		if fcm, err = push.LoadFCM(push.FCMConfig{Credentials: creds, Project: p.FCMProject, URL: p.FCMURL}); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fileOr("MOBILE_PUSH_FCM_CREDENTIALS", p.FCMCredentialsFile), err))
		}
	case p.FCMProject != "" || p.FCMURL != "":
		errs = append(errs, errors.New("MOBILE_PUSH_FCM_CREDENTIALS_FILE: not set, but MOBILE_PUSH_FCM_PROJECT or MOBILE_PUSH_FCM_URL is: FCM needs the service account's key"))
	}
	key, err := secretValue(p.APNsKey, p.APNsKeyFile, "MOBILE_PUSH_APNS_KEY")
	switch {
	case err != nil:
		errs = append(errs, err)
	case len(key) > 0:
		n := len(errs)
		for _, s := range []struct{ v, env, what string }{
			{p.APNsKeyID, "MOBILE_PUSH_APNS_KEY_ID", "the key's id"},
			{p.APNsTeamID, "MOBILE_PUSH_APNS_TEAM_ID", "the developer team's id"},
			{p.APNsTopic, "MOBILE_PUSH_APNS_TOPIC", "the app's bundle id"},
		} {
			if s.v == "" {
				errs = append(errs, fmt.Errorf("%s: not set: APNs needs %s with the key", s.env, s.what))
			}
		}
		switch p.APNsEnvironment {
		case "", push.APNsProduction, push.APNsSandbox:
		default:
			errs = append(errs, fmt.Errorf("MOBILE_PUSH_APNS_ENV: %q: production or sandbox", p.APNsEnvironment))
		}
		if p.APNsURL != "" && !httpURL(p.APNsURL, "https") {
			errs = append(errs, fmt.Errorf("MOBILE_PUSH_APNS_URL: %q is not an absolute https URL without credentials: APNs is HTTP/2 over TLS", p.APNsURL))
		}
		if len(errs) > n {
			break
		}
		apns, err = push.LoadAPNs(push.APNsConfig{Key: key, KeyID: p.APNsKeyID, TeamID: p.APNsTeamID, Topic: p.APNsTopic,
			Environment: p.APNsEnvironment, URL: p.APNsURL})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fileOr("MOBILE_PUSH_APNS_KEY", p.APNsKeyFile), err))
		}
	case p.APNsKeyID != "" || p.APNsTeamID != "" || p.APNsTopic != "" || p.APNsURL != "":
		errs = append(errs, errors.New("MOBILE_PUSH_APNS_KEY_FILE: not set, but MOBILE_PUSH_APNS_KEY_ID, _TEAM_ID, _TOPIC or _URL is: APNs needs the key"))
	}
	return fcm, apns, errs
}

// fileOr is name's _FILE variable when file is set, else name.
func fileOr(name, file string) string {
	if file != "" {
		return name + "_FILE"
	}
	return name
}

// httpURL reports whether s is an absolute URL of one of schemes with a
// host and no credentials.
func httpURL(s string, schemes ...string) bool {
	u, err := url.Parse(s)
	return err == nil && slices.Contains(schemes, u.Scheme) && u.Host != "" && u.User == nil
}
