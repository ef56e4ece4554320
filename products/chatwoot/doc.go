// Package chatwoot is the Chatwoot product adapter: a hostsdk.Connector
// that acts in one Chatwoot account through the application API
// (/api/v1/accounts/{account_id}/…) and, when a webhook secret is
// configured, turns signed Chatwoot webhook deliveries into provider
// events. It follows the reference's §8.3 (getaip/core's
// aip-connector-chatwoot) and the published Chatwoot document
// (products/internal/spectest/specs/chatwoot/swagger.json), which its
// tests check every request against.
//
// # Identity
//
// Agent agent:chatwoot:<account_id>; profiles aip.native.http (the host's)
// and aip.connector.chatwoot.v1, plus aip.connector.chatwoot.webhook.v1
// when webhook ingress is on (the reference mentions a webhook profile
// without naming it; this name is ours). The manifest's compatibility
// reports catalog_operations_supported, catalog_operations_admitted and
// composite_operations (3); webhook hosts declare the channel
// {"id":"chatwoot-webhooks","system":"chatwoot","account_id":N}.
//
// # Capabilities
//
// Composite (always offered):
//
//   - cap:chatwoot:message:create — POST …/conversations/{conversation_id}/messages
//     with content, private and message_type "outgoing"; the AIP action ID
//     is recorded in content_attributes.aip_action_id (and the idempotency
//     key, when it differs from the action ID, in
//     content_attributes.aip_idempotency_key). Output: conversation_id,
//     message_id, private, message (Chatwoot's answer).
//   - cap:chatwoot:conversation:status — POST …/conversations/{conversation_id}/toggle_status
//     with status open, resolved or pending (the document's enum; the
//     reference writes "resolve", the API takes "resolved"; snoozed is
//     not offered). An answer with payload.success false is a failed
//     result chatwoot.status_not_changed.
//   - cap:chatwoot:conversation:handoff — POST …/conversations/{conversation_id}/assignments
//     with assignee_id (or, without one, team_id), then, when note is
//     given, the note as a private outgoing message carrying the action ID
//     like message:create. A refused note after an applied assignment is
//     a failed result chatwoot.handoff_note_failed whose message and
//     details (assignment_applied true, note_error) say the assignment
//     was applied; a note whose outcome cannot be known (no answer, 5xx)
//     is outcome_unknown, its error saying the assignment was applied.
//
// Catalogue, cap:chatwoot:<suffix> (all admitted unless the operations
// file lists a subset); output {"status": <HTTP status>, "data": <Chatwoot's
// JSON or null>}:
//
//	account.get        GET  /api/v1/accounts/{account_id}
//	agent.list         GET  …/agents
//	conversation.list  GET  …/conversations?assignee_type&status&q&inbox_id&team_id&labels&page
//	conversation.meta  GET  …/conversations/meta?status&q&inbox_id&team_id&labels
//	conversation.get   GET  …/conversations/{conversation_id}
//	message.list       GET  …/conversations/{conversation_id}/messages?after&before
//	contact.list       GET  …/contacts?sort&page
//	contact.search     GET  …/contacts/search?q&sort&page
//	contact.get        GET  …/contacts/{id}
//	contact.create     POST …/contacts            (mutation)
//	contact.update     PUT  …/contacts/{id}       (mutation)
//
// labels is sent as a repeated query parameter (labels=a&labels=b), the
// document's default array style. Every input schema is closed
// (additionalProperties false) with bounds on strings, numbers and lists.
// No capability requires human approval (the reference does not ask for
// it); mutations declare idempotency "required" and the host runs one
// action ID once. Chatwoot has no idempotency header, so a mutation whose
// outcome is unknown is never retried by the connector.
//
// # Settings
//
//	--chatwoot-base-url            AIP_CHATWOOT_BASE_URL            origin only; https, or http for loopback
//	--chatwoot-account-id          AIP_CHATWOOT_ACCOUNT_ID          positive integer
//	--chatwoot-api-token-file      AIP_CHATWOOT_API_TOKEN_FILE      owner-only file, sent as the api_access_token header
//	--chatwoot-webhook-secret-file AIP_CHATWOOT_WEBHOOK_SECRET_FILE owner-only file; omit for an outbound-only host (no route)
//	--chatwoot-max-response-bytes  AIP_CHATWOOT_MAX_RESPONSE_BYTES  default 16 MiB, at most 128 MiB
//	--chatwoot-operations-file     AIP_CHATWOOT_OPERATIONS_FILE     JSON array of catalogue suffixes (≤128 KiB, not group/world-writable)
//
// Unknown suffixes, duplicates, an empty list or trailing data in the
// operations file are refused, naming the valid suffixes.
//
// # Errors
//
// Provider errors map through provider.Result: 401 provider.unauthorized,
// 403 provider.forbidden, 404 provider.not_found, 409 provider.conflict,
// 429 provider.rate_limited (retryable), other 4xx
// provider.invalid_request; a read that gets a 5xx or no answer fails with
// provider.unavailable (retryable); a mutation that gets a 5xx, no answer
// or an unreadable answer is outcome_unknown and is not run again. Health
// (CheckHealth) is GET /api/v1/accounts/{account_id}. Requests time out
// after 120 s; redirects are never followed.
//
// # Webhooks
//
// POST /webhooks/chatwoot (body ≤ 4 MiB) needs X-Chatwoot-Delivery (1 to
// 512 printable ASCII), X-Chatwoot-Timestamp (integer Unix seconds) and
// X-Chatwoot-Signature "sha256=" + hex(HMAC-SHA256(secret, timestamp + "."
// + raw body)), compared in constant time. Answers: a missing header 400
// webhook.missing_header; a bad timestamp, or one more than 300 s from
// now, 400 webhook.invalid_timestamp; a wrong signature 401
// webhook.authentication_failed; a body that is not UTF-8 400
// webhook.invalid_utf8; not a JSON object with an event name, or for
// another account, 400 webhook.invalid_delivery; storage unavailable 503
// webhook.storage_unavailable. The delivery ID is fenced in the host's
// state store (namespace aip.connector.chatwoot.webhook_replay.v1, key
// instance:<instance_id>, window 600 s: twice the skew, as a timestamp ahead
// of the clock stays acceptable that long; 10 000 deliveries, oldest
// evicted); a duplicate is answered 200 with the same accepted_events and
// "duplicate": true. Messages whose content_attributes carry
// aip_action_id (the connector's own) are accepted with no event (loop
// prevention). Any other delivery becomes one event of kind
// chatwoot.<event> on chatwoot-webhooks, its ID derived from the account
// and delivery ID, occurred_at the delivery's timestamp, data
// {delivery_id, event, account_id, conversation_id?, payload} (a payload
// over 192 KiB is replaced by its size and SHA-256).
//
// # Not covered
//
// The rest of Chatwoot's catalogue (agents/teams/inbox administration,
// canned responses, automation rules, macros, labels, custom attributes,
// conversation create/filter/priority, message update/delete, contact
// delete/filter/import/export/merge, reports), multipart uploads
// (attachments, avatars), the Platform and Client (public) APIs, tenant
// credential routing, and reconciliation of outcome_unknown actions (no
// Reconciler: Chatwoot offers no lookup by idempotency key; an operator
// can search the conversation for content_attributes.aip_action_id).
package chatwoot
