package registry

import (
	"errors"
	"fmt"
	"time"
)

// Errors every backend returns (possibly wrapped) for the same conditions.
// They are named after the failure boundaries of the registry seed; match
// them with errors.Is.
var (
	// ErrInvalid: the caller passed a malformed record, request or cursor.
	// Record validation failures are *FieldError values that match it.
	ErrInvalid = errors.New("registry: invalid")
	// ErrAdmission: a well-formed record was refused by admission rules: a
	// supply-chain attestation that is not qualified, an owner mismatch, a
	// disabled connector type, a version lifecycle that may not be installed.
	ErrAdmission = errors.New("registry: admission refused")
	// ErrConflict: the write contradicts what is recorded (an immutable field
	// changed, a revision that is not strictly newer, a capability contract
	// that differs from the one already published), or a route request whose
	// coordinates differ from the action's existing assignment.
	ErrConflict = errors.New("registry: conflict")
	// ErrNotFound: no record with that identity.
	ErrNotFound = errors.New("registry: not found")
	// ErrBindingUnavailable: the tenant has no usable binding for the
	// capability. The registry never searches another tenant or an unbound
	// implementation instead.
	ErrBindingUnavailable = errors.New("registry: binding unavailable")
	// ErrReplicaUnavailable: a binding exists but no replica is eligible (new
	// route), or the pinned replica of an existing route cannot be reserved
	// again. A retry never moves to a replacement replica.
	ErrReplicaUnavailable = errors.New("registry: replica unavailable")
	// ErrCapacityExceeded: an admission limit is reached. Errors that match it
	// are *CapacityExceededError values carrying the scope and retry guidance.
	ErrCapacityExceeded = errors.New("registry: capacity exceeded")
	// ErrStaleCursor: the catalog revision changed since the cursor was
	// issued; restart the read from the first page.
	ErrStaleCursor = errors.New("registry: stale cursor")
	// ErrFenceLost: the assignment presented for settlement is not the one the
	// registry holds for the action.
	ErrFenceLost = errors.New("registry: fence lost")
	// ErrStorage: the backend could not complete the operation; nothing may be
	// inferred about whether it committed. Only durable backends return it.
	ErrStorage = errors.New("registry: storage failure")
)

// contractErrors are the sentinels of the registry contract: every exported
// Err* of this package. A test keeps the list complete.
var contractErrors = []error{
	ErrInvalid, ErrAdmission, ErrConflict, ErrNotFound,
	ErrBindingUnavailable, ErrReplicaUnavailable, ErrCapacityExceeded,
	ErrStaleCursor, ErrFenceLost, ErrStorage,
	ErrEvidence, ErrRerouteUnsafe,
}

// IsContractError reports whether err matches one of the registry's
// sentinels (ErrInvalid … ErrStorage, ErrEvidence, ErrRerouteUnsafe). The
// typed errors (*FieldError, *CapacityExceededError, *FleetFileError,
// *LifecycleRejection) match their sentinels, so they count too. A backend
// passes such an error through unchanged instead of wrapping it as
// ErrStorage.
func IsContractError(err error) bool {
	if err == nil {
		return false
	}
	for _, target := range contractErrors {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// DefaultRetryAfter is the retry guidance of a CapacityExceededError.
const DefaultRetryAfter = 100 * time.Millisecond

// CapacityExceededError reports the admission scope that is full. It matches
// ErrCapacityExceeded.
type CapacityExceededError struct {
	Scope      AdmissionScopeKind
	Key        string
	Limit      uint32
	RetryAfter time.Duration
}

// Error implements error.
func (e *CapacityExceededError) Error() string {
	return fmt.Sprintf("registry: capacity exceeded: admission scope %s %q is at its limit of %d in flight; retry after %s",
		e.Scope, e.Key, e.Limit, e.RetryAfter)
}

// Is reports whether target is ErrCapacityExceeded.
func (e *CapacityExceededError) Is(target error) bool { return target == ErrCapacityExceeded }

// Record names used in FieldError.
const (
	RecordAdmissionPolicy   = "admission_policy"
	RecordConnectorType     = "connector_type"
	RecordConnectorVersion  = "connector_version"
	RecordConnectorInstance = "connector_instance"
	RecordCapabilityBinding = "capability_binding"
	RecordConnectorReplica  = "connector_replica"
	RecordRouteRequest      = "route_request"
	RecordCatalogQuery      = "catalog_query"
)

// FieldError says which field of which record broke which rule. Err is the
// sentinel it matches: ErrInvalid, ErrAdmission, ErrConflict or ErrNotFound.
type FieldError struct {
	Err    error
	Record string // one of the Record constants
	ID     string // the record's identity, "" when it has none yet
	Field  string // the JSON name of the field, dotted for nested fields
	Reason string // what is wrong and, where it helps, what to do
}

// Error implements error.
func (e *FieldError) Error() string {
	s := e.Err.Error() + ": " + e.Record
	if e.ID != "" {
		s += " " + e.ID
	}
	if e.Field != "" {
		s += ": " + e.Field
	}
	return s + ": " + e.Reason
}

// Unwrap returns the sentinel.
func (e *FieldError) Unwrap() error { return e.Err }

func invalid(record, id, field, format string, args ...any) error {
	return &FieldError{Err: ErrInvalid, Record: record, ID: id, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func refused(record, id, field, format string, args ...any) error {
	return &FieldError{Err: ErrAdmission, Record: record, ID: id, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func conflict(record, id, field, format string, args ...any) error {
	return &FieldError{Err: ErrConflict, Record: record, ID: id, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func missing(record, id, field, format string, args ...any) error {
	return &FieldError{Err: ErrNotFound, Record: record, ID: id, Field: field, Reason: fmt.Sprintf(format, args...)}
}
