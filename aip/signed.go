package aip

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"
)

// Members of a signed lifecycle wrapper.
const (
	SignedRequestField  = "request"
	SignedResponseField = "response"
)

// ErrMalformedSigned is returned (wrapped) when a body is not a signed
// wrapper: {"request"|"response": {...}, "signature": "..."}.
var ErrMalformedSigned = errors.New("aip: malformed signed message")

// Signed is a parsed signed wrapper. Canonical is the canonical form (see
// Canonicalize) of the inner object exactly as received, members this version does not know
// included: the signature covers them, so nothing is silently dropped.
type Signed struct {
	Field     string
	Canonical []byte
	Signature string

	// plainNames: Open found no member name that encoding/json could match
	// to a field case-insensitively, so Decode need not check.
	plainNames bool
}

// Seal canonicalizes inner, signs it with key and returns the wrapper
// {"<field>": <canonical inner>, "signature": "<base64>"}.
func Seal(key *SigningKey, field string, inner any) ([]byte, error) {
	raw, err := json.Marshal(inner)
	if err != nil {
		return nil, fmt.Errorf("aip: seal %s: %w", field, err)
	}
	return SealJSON(key, field, raw)
}

// SealJSON signs an inner object given as JSON text.
func SealJSON(key *SigningKey, field string, inner []byte) ([]byte, error) {
	out := make([]byte, 0, len(inner)+len(field)+128)
	out = append(out, `{"`...)
	out = append(out, field...)
	out = append(out, `":`...)
	start := len(out)
	out, err := AppendCanonical(out, inner)
	if err != nil {
		return nil, fmt.Errorf("aip: seal %s: %w", field, err)
	}
	if len(out) == start || out[start] != '{' {
		return nil, fmt.Errorf("%w: the %s must be a JSON object", ErrMalformedSigned, field)
	}
	sig := key.Sign(out[start:])
	out = append(out, `,"signature":"`...)
	out = appendBase64(out, sig)
	out = append(out, `"}`...)
	return out, nil
}

// Open parses a signed wrapper whose inner object is named field. The
// wrapper must be valid I-JSON with exactly the two members; duplicate
// members and trailing data are refused.
func Open(data []byte, field string) (*Signed, error) {
	r, err := canonicalizeWithout(data, "signature")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedSigned, err)
	}
	prefix := `{"` + field + `":`
	if r.removed == nil {
		return nil, fmt.Errorf("%w: no \"signature\" member", ErrMalformedSigned)
	}
	if r.members != 2 || !bytes.HasPrefix(r.canonical, []byte(prefix)) {
		return nil, fmt.Errorf("%w: want exactly the members %q and \"signature\"", ErrMalformedSigned, field)
	}
	inner := r.canonical[len(prefix) : len(r.canonical)-1]
	if len(inner) == 0 || inner[0] != '{' {
		return nil, fmt.Errorf("%w: the %s must be a JSON object", ErrMalformedSigned, field)
	}
	if len(r.removed) < 2 || r.removed[0] != '"' {
		return nil, fmt.Errorf("%w: signature must be a string", ErrMalformedSigned)
	}
	var sig string
	if err := json.Unmarshal(r.removed, &sig); err != nil {
		return nil, fmt.Errorf("%w: signature must be a string", ErrMalformedSigned)
	}
	return &Signed{Field: field, Canonical: inner, Signature: sig, plainNames: !r.foldable}, nil
}

// Verify checks the signature with pub.
func (s *Signed) Verify(pub ed25519.PublicKey) error {
	return VerifySignature(pub, s.Canonical, s.Signature)
}

// Decode unmarshals the inner object into v. A member whose name matches a
// field of v only when case is ignored is refused (ErrCaseVariantMember):
// encoding/json would bind it to that field, the reference would not.
func (s *Signed) Decode(v any) error {
	if !s.plainNames && v != nil {
		if err := checkMemberNames(s.Canonical, reflect.TypeOf(v)); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrMalformedSigned, s.Field, err)
		}
	}
	if err := json.Unmarshal(s.Canonical, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMalformedSigned, s.Field, err)
	}
	return nil
}

func appendBase64(dst, src []byte) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, base64Len(len(src)))...)
	base64Std.Encode(dst[n:], src)
	return dst
}

// NewControlRequest returns a request with a fresh ID issued at now that
// expires after MaxMessageLifetime.
func NewControlRequest(now time.Time, signerDID string, cmd ControlCommand) *ControlRequest {
	return &ControlRequest{
		RequestID: NewMessageID(),
		IssuedAt:  At(now),
		ExpiresAt: At(now.Add(MaxMessageLifetime)),
		SignerDID: signerDID,
		Command:   cmd,
	}
}

// ReceivedControlRequest is a decoded lifecycle request with its signed
// wrapper. Its signature is not yet verified: the verifier first finds the
// replica to learn which DID must have signed it.
type ReceivedControlRequest struct {
	Signed  *Signed
	Request ControlRequest
}

// OpenControlRequest parses and decodes a lifecycle request body.
func OpenControlRequest(body []byte) (*ReceivedControlRequest, error) {
	s, err := Open(body, SignedRequestField)
	if err != nil {
		return nil, err
	}
	r := &ReceivedControlRequest{Signed: s}
	if err := s.Decode(&r.Request); err != nil {
		return nil, err
	}
	if r.Request.RequestID == "" || len(r.Request.RequestID) > MaxRequestIDBytes {
		return nil, fmt.Errorf("%w: request_id must be 1 to %d bytes", ErrMalformedSigned, MaxRequestIDBytes)
	}
	if r.Request.SignerDID == "" {
		return nil, fmt.Errorf("%w: signer_did is empty", ErrMalformedSigned)
	}
	return r, nil
}

// VerifyFrom checks that the request names did as its signer and that the
// signature verifies with did's key.
func (r *ReceivedControlRequest) VerifyFrom(did string) error {
	if r.Request.SignerDID != did {
		return fmt.Errorf("%w: signer_did %s is not the expected %s", ErrBadSignature, r.Request.SignerDID, did)
	}
	pub, err := ParseDIDKey(did)
	if err != nil {
		return err
	}
	return r.Signed.Verify(pub)
}

// OpenControlResponse parses a lifecycle response body, checks that it is
// signed by the pinned control-plane DID, answers requestID and is fresh at
// now, and returns its decoded form.
func OpenControlResponse(body []byte, pinnedDID string, pinnedKey ed25519.PublicKey, requestID string, now time.Time) (*ControlResponse, error) {
	s, err := Open(body, SignedResponseField)
	if err != nil {
		return nil, err
	}
	var resp ControlResponse
	if err := s.Decode(&resp); err != nil {
		return nil, err
	}
	if resp.SignerDID != pinnedDID {
		return nil, fmt.Errorf("%w: response signer %s is not the pinned control plane %s", ErrBadSignature, resp.SignerDID, pinnedDID)
	}
	if err := s.Verify(pinnedKey); err != nil {
		return nil, err
	}
	if resp.RequestID != requestID {
		return nil, fmt.Errorf("%w: response answers request %s, not %s", ErrMalformedSigned, resp.RequestID, requestID)
	}
	if err := CheckWindow(now, resp.IssuedAt.Time, resp.ExpiresAt.Time); err != nil {
		return nil, err
	}
	return &resp, nil
}
