// Package aip is the AIP 1.0 wire model and the trust primitives every
// aipfleet component speaks.
//
// The wire model covers the native envelope (Envelope, with a Body externally
// tagged by snake_case name), principals, actions and their results, errors,
// cancellation, events, manifests and capability contracts, and the messages
// of the connector lifecycle protocol (ControlRequest, ControlResponse,
// Registration, Heartbeat, Transition, Lease) and the pinned ConnectorRoute.
// Optional members are omitted when empty. Enums are typed strings with a
// Valid method; messages have a Validate method.
//
// The trust primitives are:
//
//   - canonical JSON as the reference computes it (Canonicalize): serde_json's
//     compact output with object members sorted by the bytes of their names,
//     integers kept exactly and doubles in serde_json's form (not RFC 8785);
//     and digests ("sha256:" + hex, Digest);
//   - Ed25519 keys (SigningKey) identified by did:key (DIDKey, ParseDIDKey;
//     a public key that is a small-order point or not canonically encoded is
//     refused there and by VerifySignature, see CheckPublicKey),
//     loaded from owner-only files holding a 64-hex seed or an Ed25519 JWK
//     (LoadSigningKey), and published as a JWKS (JWKS);
//   - signed lifecycle wrappers {"request"|"response": {...}, "signature": ...}
//     (Seal, Open): the signature covers the canonical form of the inner object
//     as received, so a member unknown to this version is covered by the
//     signature rather than dropped;
//   - native envelope signatures in security.did and security.signature
//     (SignEnvelope, VerifyEnvelope; the envelope returned is decoded from
//     the canonical form that was verified);
//   - member names are case-sensitive on the wire, as in serde_json: a
//     verified document (VerifyEnvelope, Signed.Decode, SecurityValue) with
//     a member that encoding/json would bind to a field only by ignoring
//     case ("Tenant_ID" for "tenant_id") is refused (ErrCaseVariantMember);
//   - the freshness window of lifecycle messages (CheckWindow) with the
//     verifier's clock passed in.
//
// IDs are a prefix and a UUIDv7 in 32 lowercase hex digits (NewID,
// ValidateID). Timestamps are RFC 3339 UTC with millisecond precision,
// written as Rust's time crate writes them (Timestamp).
//
// Package aip does no I/O beyond reading key files, and imports nothing else
// from this module.
package aip
