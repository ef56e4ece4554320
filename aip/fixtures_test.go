package aip

import (
	"encoding/json"
	"testing"
	"time"
)

// Fixed inputs for golden files and tamper tests: deterministic keys (seeds
// 1..32 and 33..64), times and identifiers.
var (
	fixedNow = time.Date(2026, 1, 2, 3, 4, 5, 678_000_000, time.UTC)
)

func fixedKey(t testing.TB, first byte) *SigningKey {
	t.Helper()
	seed := make([]byte, 32)
	for i := range seed {
		seed[i] = first + byte(i)
	}
	k, err := NewSigningKey(seed)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func hostKey(t testing.TB) *SigningKey    { return fixedKey(t, 1) }
func controlKey(t testing.TB) *SigningKey { return fixedKey(t, 33) }

func fixedRegisterRequest(t testing.TB) *ControlRequest {
	host := hostKey(t)
	return &ControlRequest{
		RequestID: "msg_0194a3b2c1d07e3f8a9b0c1d2e3f4a5b",
		IssuedAt:  At(fixedNow),
		ExpiresAt: At(fixedNow.Add(MaxMessageLifetime)),
		SignerDID: host.DID(),
		Command: RegisterCommand(Registration{
			Replica: Replica{
				ID:                "crepl_0194a3b2c1d07e3f8a9b0c1d2e3f4a01",
				InstanceID:        "cinst_0194a3b2c1d07e3f8a9b0c1d2e3f4a02",
				VersionID:         "cver_0194a3b2c1d07e3f8a9b0c1d2e3f4a03",
				Endpoint:          "https://echo-1.internal.example:8081/aip/v1/messages",
				PeerPrincipalID:   "agent:echo",
				PeerPrincipalKind: PrincipalAgent,
				PeerDID:           host.DID(),
				TrustDomain:       "fleet.example",
				TransportProfile:  NativeHTTPProfile,
				Topology:          Topology{Region: "eu-west", Zone: "eu-west-1a", CapacityClass: DefaultCapacityClass},
				Status:            ReplicaReady,
				LeaseExpiresAt:    At(fixedNow.Add(30 * time.Second)),
				Capacity:          32,
			},
			ManifestDigest:    "sha256:1111111111111111111111111111111111111111111111111111111111111111",
			ArtifactDigest:    "sha256:2222222222222222222222222222222222222222222222222222222222222222",
			TenantID:          "tenant-acme",
			ConfigRevision:    3,
			SecretProviderRef: "vault://kv/echo/acme",
			CapabilityCount:   2,
		}),
	}
}

func fixedLeaseResponse(t testing.TB) *ControlResponse {
	return &ControlResponse{
		RequestID: "msg_0194a3b2c1d07e3f8a9b0c1d2e3f4a5b",
		IssuedAt:  At(fixedNow.Add(12 * time.Millisecond)),
		ExpiresAt: At(fixedNow.Add(12*time.Millisecond + MaxMessageLifetime)),
		SignerDID: controlKey(t).DID(),
		Outcome:   LeaseOutcome(Lease{Sequence: 1, ExpiresAt: At(fixedNow.Add(30*time.Second + 12*time.Millisecond))}),
	}
}

func fixedActionEnvelope(t testing.TB) *Envelope {
	mode := ModeSync
	cred := "cred-rev-7"
	env := &Envelope{
		AIPVersion:    Version,
		MessageType:   TypeAction,
		MessageID:     "msg_0194a3b2c1d07e3f8a9b0c1d2e3f4a60",
		SentAt:        At(fixedNow),
		CorrelationID: "corr_0194a3b2c1d07e3f8a9b0c1d2e3f4a61",
		From:          &Principal{ID: "service:aipfleet-dispatch", Kind: PrincipalService, TrustDomain: "fleet.example"},
		To:            &Principal{ID: "agent:echo", Kind: PrincipalAgent},
		Trace:         map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		Body: Body{Action: &Action{
			ID:             "act_0194a3b2c1d07e3f8a9b0c1d2e3f4a62",
			CapabilityID:   "echo.say",
			Input:          json.RawMessage(`{"message":"héllo <world> & \u2028"}`),
			Mode:           ModeSync,
			IdempotencyKey: "idem-42",
			Identity:       &IdentityContext{Tenant: &TenantRef{ID: "tenant-acme"}},
		}},
	}
	route := ConnectorRoute{
		ActionID:              "act_0194a3b2c1d07e3f8a9b0c1d2e3f4a62",
		CapabilityID:          "echo.say",
		TenantID:              "tenant-acme",
		InstanceID:            "cinst_0194a3b2c1d07e3f8a9b0c1d2e3f4a02",
		ReplicaID:             "crepl_0194a3b2c1d07e3f8a9b0c1d2e3f4a01",
		VersionID:             "cver_0194a3b2c1d07e3f8a9b0c1d2e3f4a03",
		ManifestDigest:        "sha256:1111111111111111111111111111111111111111111111111111111111111111",
		CatalogRevision:       17,
		BindingPolicyRevision: 2,
		CredentialRevisionRef: &cred,
		ReplicaHealthRevision: 5,
		FenceToken:            "route_0194a3b2c1d07e3f8a9b0c1d2e3f4a63",
		OriginalMode:          &mode,
	}
	if err := env.SetSecurity(SecurityConnectorRoute, route); err != nil {
		t.Fatal(err)
	}
	return env
}
