// Package pushtest has loopback stand-ins of the push services the
// gateway sends to, for tests: Firebase Cloud Messaging's HTTP v1 API with
// Google's OAuth2 token endpoint (FCM), and the Apple Push Notification
// service's HTTP/2 provider API (APNs). Each checks a request as the
// service does, as far as its documentation (cited in each file) says,
// and answers as the service does, dead tokens and throttling included.
package pushtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
)

// jwtParts checks a compact JWS (RFC 7515): three base64url parts whose
// first two are JSON objects, decoded into header and claims. It returns
// the signed input and the signature.
func jwtParts(s string, header, claims any) (signed []byte, sig []byte, err error) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return nil, nil, errors.New("not a compact JWS: want three parts")
	}
	dec := func(p string, v any) error {
		b, err := base64.RawURLEncoding.DecodeString(p)
		if err != nil {
			return errors.New("a part is not base64url")
		}
		if v == nil {
			return nil
		}
		return json.Unmarshal(b, v)
	}
	if err := dec(parts[0], header); err != nil {
		return nil, nil, err
	}
	if err := dec(parts[1], claims); err != nil {
		return nil, nil, err
	}
	sig, err = base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, nil, errors.New("the signature is not base64url")
	}
	return []byte(parts[0] + "." + parts[1]), sig, nil
}

// verifyRS256 checks an RS256 signature (RFC 7518 section 3.3).
func verifyRS256(pub *rsa.PublicKey, signed, sig []byte) bool {
	d := sha256.Sum256(signed)
	return rsa.VerifyPKCS1v15(pub, crypto.SHA256, d[:], sig) == nil
}

// verifyES256 checks an ES256 signature (RFC 7518 section 3.4): R and S,
// 32 bytes each, one after the other.
func verifyES256(pub *ecdsa.PublicKey, signed, sig []byte) bool {
	if len(sig) != 64 {
		return false
	}
	d := sha256.Sum256(signed)
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	return ecdsa.Verify(pub, d[:], r, s)
}
