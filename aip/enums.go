package aip

import "slices"

// oneOf reports whether v is one of the allowed values.
func oneOf[T ~string](v T, allowed ...T) bool { return slices.Contains(allowed, v) }

// PrincipalKind says what a principal is.
type PrincipalKind string

// Principal kinds.
const (
	PrincipalHuman    PrincipalKind = "human"
	PrincipalAgent    PrincipalKind = "agent"
	PrincipalService  PrincipalKind = "service"
	PrincipalTenant   PrincipalKind = "tenant"
	PrincipalCustomer PrincipalKind = "customer"
	PrincipalContact  PrincipalKind = "contact"
	PrincipalSystem   PrincipalKind = "system"
)

// Valid reports whether k is a known principal kind.
func (k PrincipalKind) Valid() bool {
	return oneOf(k, PrincipalHuman, PrincipalAgent, PrincipalService, PrincipalTenant, PrincipalCustomer, PrincipalContact, PrincipalSystem)
}

// ActionMode is how the caller expects an action to complete.
type ActionMode string

// Action modes.
const (
	ModeSync      ActionMode = "sync"
	ModeAsync     ActionMode = "async"
	ModeStreaming ActionMode = "streaming"
)

// Valid reports whether m is a known mode.
func (m ActionMode) Valid() bool { return oneOf(m, ModeSync, ModeAsync, ModeStreaming) }

// AckStatus is the status of an Ack.
type AckStatus string

// Ack statuses.
const (
	AckAccepted  AckStatus = "accepted"
	AckRejected  AckStatus = "rejected"
	AckQueued    AckStatus = "queued"
	AckStreaming AckStatus = "streaming"
	AckCached    AckStatus = "cached"
)

// Valid reports whether s is a known ack status.
func (s AckStatus) Valid() bool {
	return oneOf(s, AckAccepted, AckRejected, AckQueued, AckStreaming, AckCached)
}

// ChunkKind is the kind of a StreamChunk.
type ChunkKind string

// Stream chunk kinds.
const (
	ChunkData            ChunkKind = "data"
	ChunkProgress        ChunkKind = "progress"
	ChunkTool            ChunkKind = "tool"
	ChunkThought         ChunkKind = "thought"
	ChunkPreview         ChunkKind = "preview"
	ChunkPendingApproval ChunkKind = "pending_approval"
	ChunkError           ChunkKind = "error"
	ChunkDone            ChunkKind = "done"
)

// Valid reports whether k is a known chunk kind.
func (k ChunkKind) Valid() bool {
	return oneOf(k, ChunkData, ChunkProgress, ChunkTool, ChunkThought, ChunkPreview, ChunkPendingApproval, ChunkError, ChunkDone)
}

// ResultStatus is the status of an ActionResult.
type ResultStatus string

// Action result statuses.
const (
	ResultCompleted       ResultStatus = "completed"
	ResultFailed          ResultStatus = "failed"
	ResultCancelled       ResultStatus = "cancelled"
	ResultPendingApproval ResultStatus = "pending_approval"
	ResultRequiresHuman   ResultStatus = "requires_human"
)

// Valid reports whether s is a known result status.
func (s ResultStatus) Valid() bool {
	return oneOf(s, ResultCompleted, ResultFailed, ResultCancelled, ResultPendingApproval, ResultRequiresHuman)
}

// ErrorCategory classifies a ProtocolError.
type ErrorCategory string

// Error categories.
const (
	CategoryTemporary ErrorCategory = "temporary"
	CategoryPermanent ErrorCategory = "permanent"
	CategoryAuth      ErrorCategory = "auth"
	CategoryPolicy    ErrorCategory = "policy"
	CategoryEconomic  ErrorCategory = "economic"
	CategoryConnector ErrorCategory = "connector"
	CategoryTransport ErrorCategory = "transport"
)

// Valid reports whether c is a known category.
func (c ErrorCategory) Valid() bool {
	return oneOf(c, CategoryTemporary, CategoryPermanent, CategoryAuth, CategoryPolicy, CategoryEconomic, CategoryConnector, CategoryTransport)
}

// CapabilityKind says what a capability is.
type CapabilityKind string

// Capability kinds.
const (
	KindAgent     CapabilityKind = "agent"
	KindTool      CapabilityKind = "tool"
	KindWorkflow  CapabilityKind = "workflow"
	KindChannel   CapabilityKind = "channel"
	KindResource  CapabilityKind = "resource"
	KindHumanTask CapabilityKind = "human_task"
)

// capabilityKinds are the capability kinds, in the order errors list them.
var capabilityKinds = []CapabilityKind{KindAgent, KindTool, KindWorkflow, KindChannel, KindResource, KindHumanTask}

// Valid reports whether k is a known capability kind.
func (k CapabilityKind) Valid() bool {
	return oneOf(k, capabilityKinds...)
}

// Risk is a capability's risk level.
type Risk string

// Risk levels.
const (
	RiskLow      Risk = "low"
	RiskMedium   Risk = "medium"
	RiskHigh     Risk = "high"
	RiskCritical Risk = "critical"
)

// Valid reports whether r is a known risk level.
func (r Risk) Valid() bool { return oneOf(r, RiskLow, RiskMedium, RiskHigh, RiskCritical) }

// Stability is a capability's stability.
type Stability string

// Stability levels.
const (
	StabilityStable       Stability = "stable"
	StabilityExperimental Stability = "experimental"
	StabilityDeprecated   Stability = "deprecated"
)

// Valid reports whether s is a known stability.
func (s Stability) Valid() bool {
	return oneOf(s, StabilityStable, StabilityExperimental, StabilityDeprecated)
}

// SideEffect is a class of effect a capability may have.
type SideEffect string

// Side effects.
const (
	EffectRead            SideEffect = "read"
	EffectWrite           SideEffect = "write"
	EffectDelete          SideEffect = "delete"
	EffectSendMessage     SideEffect = "send_message"
	EffectFinancial       SideEffect = "financial"
	EffectIdentity        SideEffect = "identity"
	EffectMedical         SideEffect = "medical"
	EffectLegal           SideEffect = "legal"
	EffectExternalNetwork SideEffect = "external_network"
	EffectCodeExecution   SideEffect = "code_execution"
)

// Valid reports whether e is a known side effect.
func (e SideEffect) Valid() bool {
	return oneOf(e, EffectRead, EffectWrite, EffectDelete, EffectSendMessage, EffectFinancial, EffectIdentity, EffectMedical, EffectLegal, EffectExternalNetwork, EffectCodeExecution)
}

// IdempotencyRequirement says whether an idempotency key is required.
type IdempotencyRequirement string

// Idempotency requirements.
const (
	IdempotencyRequired    IdempotencyRequirement = "required"
	IdempotencyOptional    IdempotencyRequirement = "optional"
	IdempotencyUnsupported IdempotencyRequirement = "unsupported"
)

// Valid reports whether r is known.
func (r IdempotencyRequirement) Valid() bool {
	return oneOf(r, IdempotencyRequired, IdempotencyOptional, IdempotencyUnsupported)
}

// CollisionBehavior says what happens when an idempotency key is reused.
type CollisionBehavior string

// Collision behaviours.
const (
	CollisionReturnOriginal   CollisionBehavior = "return_original_result"
	CollisionRejectConflict   CollisionBehavior = "reject_conflict"
	CollisionRevalidateInputs CollisionBehavior = "revalidate_input_hash"
)

// Valid reports whether b is known.
func (b CollisionBehavior) Valid() bool {
	return oneOf(b, CollisionReturnOriginal, CollisionRejectConflict, CollisionRevalidateInputs)
}

// KeyScope is the scope in which an idempotency key is unique.
type KeyScope string

// Idempotency key scopes.
const (
	ScopeAction          KeyScope = "action"
	ScopeCapability      KeyScope = "capability"
	ScopePrincipal       KeyScope = "principal"
	ScopeTenant          KeyScope = "tenant"
	ScopeExternalAccount KeyScope = "external_account"
)

// Valid reports whether s is known.
func (s KeyScope) Valid() bool {
	return oneOf(s, ScopeAction, ScopeCapability, ScopePrincipal, ScopeTenant, ScopeExternalAccount)
}

// ExpectedCompletion is how a capability usually completes.
type ExpectedCompletion string

// Expected completions.
const (
	CompletionSync      ExpectedCompletion = "sync"
	CompletionAsync     ExpectedCompletion = "async"
	CompletionStreaming ExpectedCompletion = "streaming"
	CompletionAny       ExpectedCompletion = "any"
)

// Valid reports whether c is known.
func (c ExpectedCompletion) Valid() bool {
	return oneOf(c, CompletionSync, CompletionAsync, CompletionStreaming, CompletionAny)
}

// RetrySafety says whether retrying a capability is safe.
type RetrySafety string

// Retry safety levels.
const (
	RetrySafe                   RetrySafety = "safe"
	RetrySafeWithIdempotencyKey RetrySafety = "safe_with_idempotency_key"
	RetryUnsafe                 RetrySafety = "unsafe"
	RetryUnknown                RetrySafety = "unknown"
)

// Valid reports whether s is known.
func (s RetrySafety) Valid() bool {
	return oneOf(s, RetrySafe, RetrySafeWithIdempotencyKey, RetryUnsafe, RetryUnknown)
}

// Sensitivity is the sensitivity of the data a capability handles.
type Sensitivity string

// Sensitivity levels.
const (
	SensitivityPublic       Sensitivity = "public"
	SensitivityInternal     Sensitivity = "internal"
	SensitivityConfidential Sensitivity = "confidential"
	SensitivityRestricted   Sensitivity = "restricted"
	SensitivityRegulated    Sensitivity = "regulated"
	SensitivityUnknown      Sensitivity = "unknown"
)

// Valid reports whether s is known.
func (s Sensitivity) Valid() bool {
	return oneOf(s, SensitivityPublic, SensitivityInternal, SensitivityConfidential, SensitivityRestricted, SensitivityRegulated, SensitivityUnknown)
}

// TransactionMode is a transactional execution mode.
type TransactionMode string

// Transaction modes.
const (
	TxExecute             TransactionMode = "execute"
	TxDryRun              TransactionMode = "dry_run"
	TxPlan                TransactionMode = "plan"
	TxCommit              TransactionMode = "commit"
	TxCompensate          TransactionMode = "compensate"
	TxReconcile           TransactionMode = "reconcile"
	TxRollbackUnsupported TransactionMode = "rollback_not_supported"
)

// Valid reports whether m is known.
func (m TransactionMode) Valid() bool {
	return oneOf(m, TxExecute, TxDryRun, TxPlan, TxCommit, TxCompensate, TxReconcile, TxRollbackUnsupported)
}

// CompensationMode says how a capability's effects can be compensated.
type CompensationMode string

// Compensation modes.
const (
	CompensationNotRequired         CompensationMode = "not_required"
	CompensationSupported           CompensationMode = "supported"
	CompensationBestEffort          CompensationMode = "best_effort"
	CompensationRollbackUnsupported CompensationMode = "rollback_not_supported"
)

// Valid reports whether m is known.
func (m CompensationMode) Valid() bool {
	return oneOf(m, CompensationNotRequired, CompensationSupported, CompensationBestEffort, CompensationRollbackUnsupported)
}

// ReplicaStatus is a connector replica's lifecycle state in the registry.
type ReplicaStatus string

// Replica states.
const (
	ReplicaReady    ReplicaStatus = "ready"
	ReplicaDraining ReplicaStatus = "draining"
	ReplicaOffline  ReplicaStatus = "offline"
)

// Valid reports whether s is a known replica state.
func (s ReplicaStatus) Valid() bool { return oneOf(s, ReplicaReady, ReplicaDraining, ReplicaOffline) }
