package registry

import (
	"fmt"
	"strconv"

	"github.com/aipfleet/aipfleet/aip"
)

// checkAgentID holds a version's manifest agent ID to the rule of a
// replica's peer_principal_id (checkIdent), which must equal it: every
// replica of the version signs as its manifest's agent. A version whose
// agent ID breaks the rule could be admitted, but no replica of it could
// ever be provisioned or register, and the operator would learn of it
// only from a replica's error; it is refused here instead, naming the
// character and what to fix.
func checkAgentID(versionID, agentID string) error {
	const field = "manifest.agent.id"
	if checkIdent(RecordConnectorVersion, versionID, field, agentID) == nil {
		return nil
	}
	return invalid(RecordConnectorVersion, versionID, field,
		"%s: every replica of the version signs as its manifest's agent, and a replica's peer_principal_id, which must equal the agent ID, "+
			"is 1 to %d bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end, "+
			"so no replica of this version could ever be provisioned; fix the agent ID in the connector's manifest and admit that manifest",
		identFault(agentID), MaxIdentifierBytes)
}

// identFault says what keeps v from being a registry identifier
// (checkIdent): v quoted, then what is wrong, naming the character
// refused with its code point and byte offset (`"svc\u200bx" holds the
// invisible formatting character '\u200b' (U+200B) at byte 3`). It
// checks in checkIdent's order, so it names the fault checkIdent
// reports; for an identifier checkIdent takes it says only that.
func identFault(v string) string {
	q := strconv.Quote(truncate(v))
	if len(truncate(v)) < len(v) {
		q += "..."
	}
	switch {
	case v == "":
		return "is empty"
	case len(v) > MaxIdentifierBytes:
		return fmt.Sprintf("%s is %d bytes, over %d", q, len(v), MaxIdentifierBytes)
	}
	if fault := aip.IdentifierCharFault(v); fault != "" {
		return q + " " + fault
	}
	return q + " is an identifier"
}
