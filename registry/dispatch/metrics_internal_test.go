package dispatch

import (
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestErrorLabelKeepsKnownCodes: every code hostsdk answers an action with
// keeps its own series; an unknown one is "other".
func TestErrorLabelKeepsKnownCodes(t *testing.T) {
	for _, code := range []string{
		hostsdk.CodeActionExpired, hostsdk.CodeActionInProgress, hostsdk.CodeAuthentication, hostsdk.CodeCapabilityUnknown,
		hostsdk.CodeCapacity, hostsdk.CodeDecodeInvalid, hostsdk.CodeExecution, hostsdk.CodeIdempotencyConflict,
		hostsdk.CodeInputInvalid, hostsdk.CodeNotReady, hostsdk.CodeOutcomeUnknown, hostsdk.CodeOutputInvalid,
		hostsdk.CodeReplay, hostsdk.CodeResponseSigning, hostsdk.CodeRouteMismatch, hostsdk.CodeSchemaInvalid,
		hostsdk.CodeStorageUnavailable, hostsdk.CodeTooLarge, hostsdk.CodeUnsupportedMessage,
		CodeOutcomeUnknown, CodeTimeout, CodeSchedulerOverloaded,
	} {
		if got := errorLabel(code); got != code {
			t.Errorf("errorLabel(%q) = %q, want the code itself", code, got)
		}
	}
	if got := errorLabel("provider.rejected.req_1"); got != "other" {
		t.Errorf("errorLabel of an unknown code = %q, want other", got)
	}
}
