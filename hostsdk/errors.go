package hostsdk

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// BootstrapStep numbers the ten start-up steps, in the order they run.
type BootstrapStep int

// The bootstrap steps.
const (
	StepValidate     BootstrapStep = iota + 1 // validate configuration and files
	StepOpenJournal                           // open the runtime journal and install its schema
	StepDiscover                              // tenant-scoped discovery (Connector.Manifest)
	StepBindManifest                          // bind the manifest to the trust domain and signing principal
	StepBuildRoutes                           // build the native gateway and product routes, bind the listener
	StepRecover                               // recover durable work
	StepProbe                                 // probe storage and connector health
	StepRegister                              // signed register
	StepApplyLease                            // apply the lease and start heartbeats
	StepServe                                 // serve
)

var stepNames = [...]string{"", "validate", "open_journal", "discover", "bind_manifest", "build_routes", "recover", "probe", "register", "apply_lease", "serve"}

// String returns the step's name.
func (s BootstrapStep) String() string {
	if s < StepValidate || s > StepServe {
		return fmt.Sprintf("step(%d)", int(s))
	}
	return stepNames[s]
}

// StepError is implemented by the error type of every bootstrap step.
type StepError interface {
	error
	Step() BootstrapStep
}

type stepErr struct {
	step BootstrapStep
	err  error
}

// format is "hostsdk: bootstrap step 1 (validate): REASON". The reason
// leaves out a "hostsdk: " its error starts with (a *ConfigError's, for
// one), so the prefix is there once.
func (e stepErr) format() string {
	return fmt.Sprintf("hostsdk: bootstrap step %d (%s): %s", int(e.step), e.step, strings.TrimPrefix(fmt.Sprint(e.err), "hostsdk: "))
}

// ValidateError: step 1, the configuration or one of its files is invalid.
// It matches ErrSetting (the operator must change a setting, or a file a
// setting names: a --signing-seed-file others can read, a missing
// --control-plane-did-file), unless it is the start's cancellation.
type ValidateError struct{ Err error }

// OpenJournalError: step 2, the runtime journal could not be opened.
type OpenJournalError struct{ Err error }

// DiscoverError: step 3, the connector's tenant-scoped discovery failed.
type DiscoverError struct{ Err error }

// BindManifestError: step 4, the manifest cannot be bound to the host's
// trust domain and signing principal (or is invalid or too large).
type BindManifestError struct{ Err error }

// BuildRoutesError: step 5, the gateway or product routes could not be
// built, or the listener could not be bound.
type BuildRoutesError struct{ Err error }

// RecoverError: step 6, durable recovery failed or reported errors; the
// replica is not registered.
type RecoverError struct{ Err error }

// ProbeError: step 7, storage or connector health is not ready.
type ProbeError struct{ Err error }

// RegisterError: step 8, the signed registration failed or was rejected.
// A rejection because a setting of the host differs from what the fleet
// pre-provisioned for the replica (its signing key's DID is not the
// replica's peer_did, a replica ID not pre-provisioned, another instance,
// version, endpoint, trust domain, topology, tenant, configuration
// revision, secret-provider reference or artifact digest) matches
// ErrSetting, and its text ends with the setting to fix.
type RegisterError struct{ Err error }

// ApplyLeaseError: step 9, the returned lease could not be applied.
type ApplyLeaseError struct{ Err error }

// ServeError: step 10, the HTTP server could not start serving.
type ServeError struct{ Err error }

func (e *ValidateError) Error() string           { return stepErr{StepValidate, e.Err}.format() }
func (e *OpenJournalError) Error() string        { return stepErr{StepOpenJournal, e.Err}.format() }
func (e *DiscoverError) Error() string           { return stepErr{StepDiscover, e.Err}.format() }
func (e *BindManifestError) Error() string       { return stepErr{StepBindManifest, e.Err}.format() }
func (e *BuildRoutesError) Error() string        { return stepErr{StepBuildRoutes, e.Err}.format() }
func (e *RecoverError) Error() string            { return stepErr{StepRecover, e.Err}.format() }
func (e *ProbeError) Error() string              { return stepErr{StepProbe, e.Err}.format() }
func (e *RegisterError) Error() string           { return stepErr{StepRegister, e.Err}.format() }
func (e *ApplyLeaseError) Error() string         { return stepErr{StepApplyLease, e.Err}.format() }
func (e *ServeError) Error() string              { return stepErr{StepServe, e.Err}.format() }
func (e *ValidateError) Unwrap() error           { return e.Err }
func (e *OpenJournalError) Unwrap() error        { return e.Err }
func (e *DiscoverError) Unwrap() error           { return e.Err }
func (e *BindManifestError) Unwrap() error       { return e.Err }
func (e *BuildRoutesError) Unwrap() error        { return e.Err }
func (e *RecoverError) Unwrap() error            { return e.Err }
func (e *ProbeError) Unwrap() error              { return e.Err }
func (e *RegisterError) Unwrap() error           { return e.Err }
func (e *ApplyLeaseError) Unwrap() error         { return e.Err }
func (e *ServeError) Unwrap() error              { return e.Err }
func (e *ValidateError) Step() BootstrapStep     { return StepValidate }
func (e *OpenJournalError) Step() BootstrapStep  { return StepOpenJournal }
func (e *DiscoverError) Step() BootstrapStep     { return StepDiscover }
func (e *BindManifestError) Step() BootstrapStep { return StepBindManifest }
func (e *BuildRoutesError) Step() BootstrapStep  { return StepBuildRoutes }
func (e *RecoverError) Step() BootstrapStep      { return StepRecover }
func (e *ProbeError) Step() BootstrapStep        { return StepProbe }
func (e *RegisterError) Step() BootstrapStep     { return StepRegister }
func (e *ApplyLeaseError) Step() BootstrapStep   { return StepApplyLease }
func (e *ServeError) Step() BootstrapStep        { return StepServe }

// Is reports whether target is ErrSetting and e is not a cancellation
// of the start (a context ended between the step's checks and the next
// step), which is no setting's fault.
func (e *ValidateError) Is(target error) bool {
	return target == ErrSetting && !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded)
}

func wrapStep(step BootstrapStep, err error) error {
	switch step {
	case StepValidate:
		return &ValidateError{err}
	case StepOpenJournal:
		return &OpenJournalError{err}
	case StepDiscover:
		return &DiscoverError{err}
	case StepBindManifest:
		return &BindManifestError{err}
	case StepBuildRoutes:
		return &BuildRoutesError{err}
	case StepRecover:
		return &RecoverError{err}
	case StepProbe:
		return &ProbeError{err}
	case StepRegister:
		return &RegisterError{err}
	case StepApplyLease:
		return &ApplyLeaseError{err}
	default:
		return &ServeError{err}
	}
}

// Lifecycle errors.
var (
	// ErrAlreadyStarted: Start was called twice, or after Stop.
	ErrAlreadyStarted = errors.New("hostsdk: host already started")
	// ErrControlUnavailable marks an ambiguous lifecycle failure (transport
	// error, timeout, unsigned or unverifiable answer, retryable
	// rejection): the request may or may not have been applied.
	ErrControlUnavailable = errors.New("hostsdk: lifecycle service unavailable")
)

// ControlRejectedError is a definitive signed rejection by the lifecycle
// service (admission or configuration mismatch, lost sequence fence).
type ControlRejectedError struct {
	Operation string
	Code      string
	Message   string
}

func (e *ControlRejectedError) Error() string {
	return fmt.Sprintf("hostsdk: lifecycle %s rejected: %s: %s", e.Operation, e.Code, e.Message)
}

// settingRefusedError is a registration the control plane refused
// because a setting of the host differs from what the fleet
// pre-provisioned (Host.settingRefusal): it matches ErrSetting, so the
// program exits 2, and its text ends with what to fix.
type settingRefusedError struct {
	err  error // the *ControlRejectedError
	hint string
}

func (e *settingRefusedError) Error() string   { return e.err.Error() + "; " + e.hint }
func (e *settingRefusedError) Unwrap() []error { return []error{e.err, ErrSetting} }

// ShutdownError joins the failures of a shutdown; each part names its step
// ("HTTP server", "heartbeat worker", "registry drain", "registry offline
// transition", ...).
type ShutdownError struct{ Errs []error }

func (e *ShutdownError) Error() string {
	return "hostsdk: shutdown was not clean: " + errors.Join(e.Errs...).Error()
}

// Unwrap returns the joined failures.
func (e *ShutdownError) Unwrap() []error { return e.Errs }
