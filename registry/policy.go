package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"slices"
	"time"
)

// Unlimited as an admission limit disables that counter: it is neither
// checked nor reserved.
const Unlimited uint32 = math.MaxUint32

// Circuit open interval bounds.
const (
	MinCircuitOpen = 100 * time.Millisecond
	MaxCircuitOpen = time.Hour
)

// ImplicitPolicyRef names the policy that applies to a binding without a
// quota policy reference. It is not stored and cannot be put.
const ImplicitPolicyRef = "quota:implicit-default"

// AdmissionPolicy bounds in-flight work per scope and configures the replica
// circuit breaker. Every limit and the threshold are at least 1 (Unlimited
// disables a limit); CircuitOpenMS is 100..3 600 000. Changes need a strictly
// greater Revision. A disabled policy admits no new routes: bindings that
// use it are unavailable for new work (existing routes keep the limits they
// reserved under).
type AdmissionPolicy struct {
	PolicyRef                string `json:"policy_ref"`
	Revision                 uint64 `json:"revision"`
	Enabled                  bool   `json:"enabled"`
	MaxGlobalInFlight        uint32 `json:"max_global_in_flight"`
	MaxTenantInFlight        uint32 `json:"max_tenant_in_flight"`
	MaxConnectorTypeInFlight uint32 `json:"max_connector_type_in_flight"`
	MaxInstanceInFlight      uint32 `json:"max_instance_in_flight"`
	MaxBindingInFlight       uint32 `json:"max_binding_in_flight"`
	MaxTenantRetryInFlight   uint32 `json:"max_tenant_retry_in_flight"`
	CircuitFailureThreshold  uint32 `json:"circuit_failure_threshold"`
	CircuitOpenMS            uint64 `json:"circuit_open_ms"`
}

// ConservativePolicy returns the conservative preset: global 10 000, tenant
// 1 000, connector type 2 000, instance 500, binding 250, tenant retry 100,
// circuit threshold 5, open 30 s. Revision 1, enabled.
func ConservativePolicy(ref string) AdmissionPolicy {
	return AdmissionPolicy{
		PolicyRef: ref, Revision: 1, Enabled: true,
		MaxGlobalInFlight: 10_000, MaxTenantInFlight: 1_000, MaxConnectorTypeInFlight: 2_000,
		MaxInstanceInFlight: 500, MaxBindingInFlight: 250, MaxTenantRetryInFlight: 100,
		CircuitFailureThreshold: 5, CircuitOpenMS: 30_000,
	}
}

// FleetPolicy returns the fleet preset: the conservative preset with the
// global and connector-type counters disabled, so tenants do not serialise
// through one fleet-wide counter.
func FleetPolicy(ref string) AdmissionPolicy {
	p := ConservativePolicy(ref)
	p.MaxGlobalInFlight = Unlimited
	p.MaxConnectorTypeInFlight = Unlimited
	return p
}

// PolicyPreset returns a preset by name ("conservative" or "fleet").
func PolicyPreset(name, ref string) (AdmissionPolicy, bool) {
	switch name {
	case "conservative":
		return ConservativePolicy(ref), true
	case "fleet":
		return FleetPolicy(ref), true
	}
	return AdmissionPolicy{}, false
}

// ImplicitAdmissionPolicy is the policy of bindings without a quota policy
// reference: the fleet preset under ImplicitPolicyRef.
func ImplicitAdmissionPolicy() AdmissionPolicy { return FleetPolicy(ImplicitPolicyRef) }

// CircuitOpen returns the open interval.
func (p *AdmissionPolicy) CircuitOpen() time.Duration {
	return time.Duration(p.CircuitOpenMS) * time.Millisecond
}

// Validate checks the policy's shape.
func (p *AdmissionPolicy) Validate() error {
	const r = RecordAdmissionPolicy
	if err := checkIdent(r, p.PolicyRef, "policy_ref", p.PolicyRef); err != nil {
		return err
	}
	if p.PolicyRef == ImplicitPolicyRef {
		return invalid(r, p.PolicyRef, "policy_ref", "%s is reserved for bindings without a quota policy", ImplicitPolicyRef)
	}
	if p.Revision == 0 {
		return invalid(r, p.PolicyRef, "revision", "must be at least 1")
	}
	if err := checkRevision(r, p.PolicyRef, "revision", p.Revision); err != nil {
		return err
	}
	for _, l := range []struct {
		field string
		v     uint32
	}{
		{"max_global_in_flight", p.MaxGlobalInFlight},
		{"max_tenant_in_flight", p.MaxTenantInFlight},
		{"max_connector_type_in_flight", p.MaxConnectorTypeInFlight},
		{"max_instance_in_flight", p.MaxInstanceInFlight},
		{"max_binding_in_flight", p.MaxBindingInFlight},
		{"max_tenant_retry_in_flight", p.MaxTenantRetryInFlight},
		{"circuit_failure_threshold", p.CircuitFailureThreshold},
	} {
		if l.v == 0 {
			return invalid(r, p.PolicyRef, l.field, "must be at least 1 (%d disables the limit)", Unlimited)
		}
	}
	// Compared in milliseconds: converted to a time.Duration first, a
	// value of 2^58 ms or more wraps around (1 000 + 2^58 ms is 1 s), and
	// would be accepted as what it wraps to.
	if ms := p.CircuitOpenMS; ms < uint64(MinCircuitOpen.Milliseconds()) || ms > uint64(MaxCircuitOpen.Milliseconds()) {
		return invalid(r, p.PolicyRef, "circuit_open_ms", "%d must be between %d and %d", p.CircuitOpenMS, MinCircuitOpen.Milliseconds(), MaxCircuitOpen.Milliseconds())
	}
	return nil
}

// CheckPolicyUpdate applies the mutability rule of a policy: any change needs
// a strictly greater revision. It returns changed=false for an identical
// re-put.
func CheckPolicyUpdate(stored, next *AdmissionPolicy) (changed bool, err error) {
	if *stored == *next {
		return false, nil
	}
	if next.Revision <= stored.Revision {
		return false, conflict(RecordAdmissionPolicy, next.PolicyRef, "revision", "%d is not newer than the stored revision %d; raise it with every change", next.Revision, stored.Revision)
	}
	return true, nil
}

// AdmissionScopeKind names an admission counter family.
type AdmissionScopeKind string

// Admission scope kinds, in the order a reservation checks them.
const (
	ScopeGlobal        AdmissionScopeKind = "global"
	ScopeTenant        AdmissionScopeKind = "tenant"
	ScopeConnectorType AdmissionScopeKind = "connector_type"
	ScopeInstance      AdmissionScopeKind = "instance"
	ScopeBinding       AdmissionScopeKind = "binding"
	ScopeTenantRetry   AdmissionScopeKind = "tenant_retry"
)

// GlobalScopeKey is the key of the one global counter.
const GlobalScopeKey = "fleet"

// AdmissionScope is one counter a route reserves, with the limit that
// applied when the route was created.
type AdmissionScope struct {
	Kind  AdmissionScopeKind `json:"kind"`
	Key   string             `json:"key"`
	Limit uint32             `json:"limit"`
}

// AdmissionReservation is the policy snapshot a route was admitted under:
// the base scopes every attempt reserves, the retry scope a re-reservation
// adds, and the circuit settings its settlements apply. PolicyRef is empty
// for the implicit policy.
type AdmissionReservation struct {
	PolicyRef               string           `json:"policy_ref,omitempty"`
	PolicyRevision          uint64           `json:"policy_revision"`
	BaseScopes              []AdmissionScope `json:"base_scopes"`
	RetryScope              *AdmissionScope  `json:"retry_scope,omitempty"`
	CircuitFailureThreshold uint32           `json:"circuit_failure_threshold"`
	CircuitOpenMS           uint64           `json:"circuit_open_ms"`
}

// Scopes returns the scopes an attempt reserves: the base scopes, plus the
// retry scope when retry is set.
func (a *AdmissionReservation) Scopes(retry bool) []AdmissionScope {
	if !retry || a.RetryScope == nil {
		return a.BaseScopes
	}
	return append(slices.Clip(a.BaseScopes), *a.RetryScope)
}

func (a *AdmissionReservation) equal(b *AdmissionReservation) bool {
	if a.PolicyRef != b.PolicyRef || a.PolicyRevision != b.PolicyRevision ||
		a.CircuitFailureThreshold != b.CircuitFailureThreshold || a.CircuitOpenMS != b.CircuitOpenMS ||
		!slices.Equal(a.BaseScopes, b.BaseScopes) || (a.RetryScope == nil) != (b.RetryScope == nil) {
		return false
	}
	return a.RetryScope == nil || *a.RetryScope == *b.RetryScope
}

// BindingScopeKey returns the binding counter key: "sha256:" + hex of
// SHA-256(tenant U+001F capability U+001F instance).
func BindingScopeKey(k BindingKey) string {
	h := sha256.New()
	h.Write([]byte(k.TenantID))
	h.Write([]byte{0x1f})
	h.Write([]byte(k.CapabilityID))
	h.Write([]byte{0x1f})
	h.Write([]byte(k.InstanceID))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// NewReservation builds the reservation a new route on binding b (of an
// instance of connectorTypeID) holds under policy p. Unlimited counters are
// left out. bindingScopeKey is BindingScopeKey(b.Key()), passed in so
// backends can compute it once per binding.
func NewReservation(p *AdmissionPolicy, b *CapabilityBinding, connectorTypeID, bindingScopeKey string) AdmissionReservation {
	r := AdmissionReservation{
		PolicyRevision:          p.Revision,
		CircuitFailureThreshold: p.CircuitFailureThreshold,
		CircuitOpenMS:           p.CircuitOpenMS,
		BaseScopes:              make([]AdmissionScope, 0, 5),
	}
	if p.PolicyRef != ImplicitPolicyRef {
		r.PolicyRef = p.PolicyRef
	}
	add := func(kind AdmissionScopeKind, key string, limit uint32) {
		if limit != Unlimited {
			r.BaseScopes = append(r.BaseScopes, AdmissionScope{Kind: kind, Key: key, Limit: limit})
		}
	}
	add(ScopeGlobal, GlobalScopeKey, p.MaxGlobalInFlight)
	add(ScopeTenant, b.TenantID, p.MaxTenantInFlight)
	add(ScopeConnectorType, connectorTypeID, p.MaxConnectorTypeInFlight)
	add(ScopeInstance, b.InstanceID, p.MaxInstanceInFlight)
	add(ScopeBinding, bindingScopeKey, p.MaxBindingInFlight)
	if p.MaxTenantRetryInFlight != Unlimited {
		r.RetryScope = &AdmissionScope{Kind: ScopeTenantRetry, Key: b.TenantID, Limit: p.MaxTenantRetryInFlight}
	}
	return r
}

// CapacityExceeded returns the error for a full scope.
func CapacityExceeded(s AdmissionScope) error {
	return &CapacityExceededError{Scope: s.Kind, Key: s.Key, Limit: s.Limit, RetryAfter: DefaultRetryAfter}
}

// ApplySettlementToCircuit returns the circuit after a settlement at now:
// completed closes it and clears the failures; outcome_unknown counts a
// failure and, once the reservation's threshold is reached, opens it until
// now + the open interval (never shortening an open circuit); cancelled,
// lease_expired and pruned leave it as it is.
func ApplySettlementToCircuit(c CircuitState, outcome RouteSettlement, r *AdmissionReservation, now time.Time) CircuitState {
	switch outcome {
	case SettlementCompleted:
		return CircuitState{}
	case SettlementOutcomeUnknown:
		if r.CircuitFailureThreshold == 0 {
			return c
		}
		if c.ConsecutiveFailures < math.MaxUint32 {
			c.ConsecutiveFailures++
		}
		if c.ConsecutiveFailures >= r.CircuitFailureThreshold {
			until := Millis(now.Add(time.Duration(r.CircuitOpenMS) * time.Millisecond))
			if until.After(c.OpenUntil) {
				c.OpenUntil = until
			}
		}
	}
	return c
}
