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
//     is recorded in content_attributes.aip_action_id (and, when the
//     idempotency key differs from the action ID, the key scoped to the
//     tenant and capability, provider.CallIdempotencyKey's aip1-<hex>, in
//     content_attributes.aip_idempotency_key: never the caller's key as
//     it is, as content attributes reach the contact's widget). Output: conversation_id,
//     message_id, private, message (Chatwoot's answer). A 422 does not
//     say that the message was not stored: Chatwoot's
//     MessagesController#create answers every error with 422 (rescue
//     StandardError), also one raised after the message was committed by
//     its after_create_commit callbacks (reopening the conversation,
//     dispatching its events, queueing its delivery with
//     SendReplyJob.perform_later), which Rails raises out of save!. So
//     after a 422 the connector reads the conversation's latest messages
//     (GET …/messages, the latest 20) and looks for the one whose
//     content_attributes.aip_action_id is the action's ID: found, the
//     action is outcome_unknown naming the message (stored, maybe not
//     delivered); not found, the 422 is a failed result when the list
//     reaches back to before the message was sent (fewer than 20
//     messages, or one created more than 5 minutes before it was sent,
//     by Chatwoot's created_at, so a Chatwoot clock up to 5 minutes
//     behind is allowed for); otherwise (the read failed, or all 20 are
//     newer) outcome_unknown, saying to look for the action's ID in
//     message.list.
//   - cap:chatwoot:conversation:status — POST …/conversations/{conversation_id}/toggle_status
//     with status open, resolved or pending (the document's enum; the
//     reference writes "resolve", the API takes "resolved"; snoozed is
//     not offered). An answer with payload.success false is a failed
//     result chatwoot.status_not_changed.
//   - cap:chatwoot:conversation:handoff — POST …/conversations/{conversation_id}/assignments
//     with assignee_id or team_id (not both: Chatwoot ignores team_id next
//     to assignee_id, so the schema refuses the pair), then, when note is
//     given, the note as a private outgoing message carrying the action ID
//     like message:create. Chatwoot assigns the agent (team) it finds in
//     the account: for an ID it does not have it clears the assignee
//     (team) and answers null, which is a failed result
//     chatwoot.handoff_not_assigned saying so (details: assignment_applied
//     false, cleared "assignee" or "team"; no note is added); an
//     answer naming another agent or team is outcome_unknown. A refused
//     note after an applied assignment is
//     a failed result chatwoot.handoff_note_failed whose message and
//     details (assignment_applied true, note_error) say the assignment
//     was applied; a note whose outcome cannot be known (no answer, 5xx,
//     or a 422 after which the note may have been stored, as for
//     message:create) is outcome_unknown, its error saying the assignment
//     was applied.
//
// Catalogue, cap:chatwoot:<suffix>; output {"status": <HTTP status>,
// "data": <Chatwoot's JSON or null>} (null where Chatwoot answers without
// a body: deletes, conversation.priority, a contact update's 204). Paths
// are under /api/v1/accounts/{account_id}, as the document has them:
//
//	account.get                       GET    /api/v1/accounts/{account_id}
//	agent.list                        GET    …/agents
//	agent.create                      POST   …/agents                                  (opt-in, mutation, high)
//	agent.update                      PATCH  …/agents/{id}                             (opt-in, mutation, high)
//	agent.delete                      DELETE …/agents/{id}                             (opt-in, mutation, high)
//	canned_response.list              GET    …/canned_responses
//	canned_response.create            POST   …/canned_responses                        (mutation)
//	canned_response.update            PATCH  …/canned_responses/{id}                   (mutation)
//	canned_response.delete            DELETE …/canned_responses/{id}                   (mutation, high)
//	conversation.list                 GET    …/conversations?assignee_type&status&q&inbox_id&team_id&labels&page
//	conversation.meta                 GET    …/conversations/meta?status&q&inbox_id&team_id&labels
//	conversation.get                  GET    …/conversations/{conversation_id}
//	conversation.create               POST   …/conversations                           (mutation)
//	conversation.update               PATCH  …/conversations/{conversation_id}         (mutation: priority, sla_policy_id)
//	conversation.filter               POST   …/conversations/filter?page               (mutation, low: a POST)
//	conversation.priority             POST   …/conversations/{conversation_id}/toggle_priority   (mutation)
//	conversation.custom_attributes    POST   …/conversations/{conversation_id}/custom_attributes (mutation)
//	conversation.label.list           GET    …/conversations/{conversation_id}/labels
//	conversation.label.update         POST   …/conversations/{conversation_id}/labels  (mutation; replaces the labels)
//	message.list                      GET    …/conversations/{conversation_id}/messages?after&before
//	message.delete                    DELETE …/conversations/{conversation_id}/messages/{message_id} (mutation, high)
//	contact.list                      GET    …/contacts?sort&page
//	contact.search                    GET    …/contacts/search?q&sort&page
//	contact.get                       GET    …/contacts/{id}
//	contact.create                    POST   …/contacts                                (mutation)
//	contact.update                    PUT    …/contacts/{id}                           (mutation)
//	contact.delete                    DELETE …/contacts/{id}                           (mutation, high)
//	contact.filter                    POST   …/contacts/filter?page                    (mutation, low: a POST)
//	contact.conversation.list         GET    …/contacts/{id}/conversations
//	contact.label.list                GET    …/contacts/{id}/labels
//	contact.label.update              POST   …/contacts/{id}/labels                    (mutation; replaces the labels)
//	inbox.list                        GET    …/inboxes        (channel credentials left out)
//	inbox.get                         GET    …/inboxes/{id}   (channel credentials left out)
//	team.list                         GET    …/teams
//	team.get                          GET    …/teams/{team_id}
//	label.list                        GET    …/labels
//	custom_attribute_definition.list  GET    …/custom_attribute_definitions?attribute_model (required: "0" conversation, "1" contact)
//
// Chatwoot's inbox answers to administrators carry channel credentials
// the document does not list (hmac_token, imap_password, smtp_password,
// provider_config with API keys, bot and page tokens); inbox.list and
// inbox.get leave those members out of their outputs at any depth.
//
// Path IDs are input fields named after what they identify (contact_id,
// agent_id, canned_response_id, inbox_id, team_id, conversation_id,
// message_id); every other input field has the document's name and is
// sent where the document puts it. labels in conversation.list/meta is one
// query parameter, the labels joined by commas (labels=a,b: OpenAPI's form
// style without explode), not the document's default repeated parameter
// (labels=a&labels=b), of which Rails keeps only the last, so that
// Chatwoot filters by every label given; a label with a comma is refused
// there and in the label updates, as Chatwoot would split it into two. The filters take the document's payload (attribute_key,
// filter_operator, values, query_operator); query_operator joins a
// condition to the next, so the connector requires it on every condition
// but the last and refuses it on the last (failed chatwoot.input_invalid,
// before any call). conversation.create sends the initial message as the
// document describes it, without content_attributes: a webhook of that
// message is not recognised as the connector's own and becomes an event.
// Given inbox_id and contact_id, Chatwoot links the contact to the inbox
// with source_id before, and outside, the transaction that creates the
// conversation (ContactInboxBuilder; in an email, SMS, Twilio or WhatsApp
// inbox it first gives another contact's contact inbox holding that
// source ID a new one): a create it then refuses (a 422 for an invalid
// assignee, team or message) or does not answer leaves the link made, so
// its failure (or outcome_unknown) says what may have changed and how to
// check (contact.get, contact.search). An input holding the character U+0000 anywhere (a value or a member
// name) is refused chatwoot.input_invalid, naming where, before any call:
// Chatwoot keeps its text in PostgreSQL, which cannot store it, and would
// answer with a 500 that a mutation could only report as outcome_unknown.
//
// Admission: without --chatwoot-operations-file every operation is offered
// except agent.create, agent.update and agent.delete. These administer
// the account's people (invite a user, make one an administrator, remove
// one) rather than act in conversations, and need an administrator's
// token; a deployment opts in by listing them in the file (the file
// accepts every suffix above and offers exactly what it lists).
// catalog_operations_supported counts the whole catalogue (37),
// catalog_operations_admitted what this host offers.
//
// Every input schema is closed (additionalProperties false) with bounds
// on strings, numbers and lists; updates need at least one field to
// change. Reads (GETs) are risk low and retry-safe. Every other method is
// a mutation, the filters included: the document does not say that their
// POSTs change nothing (they stay risk low, and are safe to repeat with
// the same key). Mutations declare idempotency "required" and the host
// runs one action ID once; those that create (contact.create,
// conversation.create, canned_response.create, agent.create) are
// retry-unsafe as a new action, the others set state and are safe with
// the same key. Irreversible deletes (contact.delete, message.delete,
// canned_response.delete) are risk high with side effect delete; agent
// administration is risk high with side effect identity; other mutations
// are risk medium (conversation.create: send_message, it may send the
// initial message). No capability requires human approval (the reference
// does not ask for it). Chatwoot has no idempotency header, so a mutation
// whose outcome is unknown is never retried by the connector.
//
// # Settings
//
//	--chatwoot-base-url            AIP_CHATWOOT_BASE_URL            origin only; https, or http for loopback
//	--chatwoot-account-id          AIP_CHATWOOT_ACCOUNT_ID          positive integer
//	--chatwoot-api-token-file      AIP_CHATWOOT_API_TOKEN_FILE      owner-only file, sent as the api_access_token header
//	--chatwoot-webhook-secret-file AIP_CHATWOOT_WEBHOOK_SECRET_FILE owner-only file; omit for an outbound-only host (no route)
//	--chatwoot-webhook-previous-secret-file AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE
//	                               owner-only file with the secret being replaced, verified too
//	                               while Chatwoot switches (see Webhooks); needs the secret file
//	--chatwoot-max-response-bytes  AIP_CHATWOOT_MAX_RESPONSE_BYTES  default 16 MiB, at most 128 MiB
//	--chatwoot-operations-file     AIP_CHATWOOT_OPERATIONS_FILE     JSON array of catalogue suffixes (≤128 KiB, not group/world-writable);
//	                                                                default: all but agent.create|update|delete
//
// Unknown suffixes, duplicates, an empty list or trailing data in the
// operations file are refused, naming the valid suffixes.
//
// The token and webhook secret files must read at start and are then
// followed (provider.ReadSecret): a token or secret rewritten in its file,
// or a file renamed over it, is used without a restart. A request checks
// the file at most once a second; the token file is read at once when
// Chatwoot answers 401 or 403 (the request is sent once more when the
// token changed), and the secret files are checked at once when a
// delivery does not verify. A file that cannot be read
// again keeps the value read before and is logged at warn, naming the
// setting and the file.
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
// after 120 s; redirects are never followed. The token goes in the
// document's api_access_token header, whose name has underscores: a
// reverse proxy in front of Chatwoot may drop it (nginx does unless
// underscores_in_headers is on, as Chatwoot's self-hosting guide sets it),
// and the probe then fails with a 401 although the token is right.
//
// # Webhooks
//
// POST /webhooks/chatwoot (body ≤ 4 MiB) needs X-Chatwoot-Delivery (1 to
// 512 printable ASCII), X-Chatwoot-Timestamp (integer Unix seconds) and
// X-Chatwoot-Signature "sha256=" + hex(HMAC-SHA256(secret, timestamp + "."
// + raw body)), compared in constant time with the webhook secret and,
// when --chatwoot-webhook-previous-secret-file is set, with that one too
// (both are always computed): during a rotation Chatwoot may sign with
// either. A delivery verified by the previous secret is logged at info
// when it starts a streak, and the first verified by the current secret
// after such a streak too (Chatwoot has switched: remove the previous
// setting once no delivery needs it; webhook.Secrets). Answers: a missing header 400
// webhook.missing_header; a bad timestamp, or one more than 300 s from
// now, 400 webhook.invalid_timestamp; a wrong signature 401
// webhook.authentication_failed; a body that is not UTF-8 400
// webhook.invalid_utf8; not a JSON object with an event name, or for
// another account (account.id and account_id are both checked when
// present, and one that is not an integer is refused too), 400
// webhook.invalid_delivery; the replay fence unreadable, or the events
// not stored (the replica draining, its outbox full, storage failing) 500
// webhook.storage_unavailable (an event time ahead of the host's clock
// 500 webhook.invalid_timestamp): 500, not 503, is what gets an agent
// bot's delivery sent again (ResendStatus, below). The delivery ID and the signature are
// fenced in the host's state store (namespace
// aip.connector.chatwoot.webhook_replay.v1, key instance:<instance_id>,
// window 600 s: twice the skew, as a timestamp ahead of the clock stays
// acceptable that long; 10 000 entries, two a delivery, oldest evicted):
// the delivery ID header is not signed, so a delivery sent again under
// another delivery ID is caught by its signature, which is claimed for
// the delivery ID before the events are published (a copy is a duplicate
// even when the original's publication failed, and the original may be
// delivered again). A duplicate is answered
// 200 with the same accepted_events and "duplicate": true. A delivery
// whose events are stored is accepted even when its delivery ID could not
// be recorded in the fence (its signed material stays claimed).
//
// Chatwoot (Webhooks::Trigger, lib/webhooks/trigger.rb) signs each
// attempt at the time it sends it, with a random X-Chatwoot-Delivery UUID
// per webhook and event, and takes any error answer, or none, as a failed
// delivery: for an account webhook it only logs it; for an API inbox's
// webhook it marks the message (message_created, message_updated)
// failed, and for an agent bot's it moves a pending conversation to open.
// Only an agent bot's delivery answered 429 or 500 is tried again
// (AgentBots::WebhookJob: 3 attempts, 3 s apart, the same delivery ID,
// signed at the new time; a 503 is not). So what may pass, the route
// answers 500 (ResendStatus): an agent bot's delivery is sent twice more
// and taken once the replica can store it (the failed attempt's
// signature stays claimed for its own delivery ID, so the resend is not
// a duplicate). For an account's or an API inbox's webhook a 500 is a
// failed delivery like any other answer, and what the route refuses for
// good keeps its 4xx. A delivery refused, or not taken within those
// attempts, is lost: after an outage read the conversations
// (conversation.list, message.list). So every refusal of a delivery whose signature verified
// is logged at warn with its delivery ID and why: a timestamp out of the
// window (with clock_offset, the replica's clock minus the timestamp, and
// a reminder to check the host's clock: a replica whose clock is more
// than 300 s off refuses every delivery), another account, a body that
// cannot be mapped, events the host does not store (a full outbox, a
// replica draining: webhook.Refusals.PublishFailed); so is a signature
// that does not verify (what a secret differing from Chatwoot's looks
// like). Each kind is logged at most once a minute, the next line
// counting those not logged (not_logged_since: webhook.Refusals).
// Messages whose content_attributes carry aip_action_id (the connector's
// own) are accepted with no event (loop prevention). Any other delivery
// becomes one event of kind chatwoot.<event> on chatwoot-webhooks, its
// ID derived from the account and delivery ID, occurred_at the delivery's
// timestamp, data
// {delivery_id, event, account_id, conversation_id?, payload}. A payload
// over 192 KiB (a long message: Chatwoot sends its content twice, once in
// conversation.messages) is cut down to fit: without
// conversation.messages, then without its largest members, largest first;
// payload_omitted lists what was left out, payload_bytes and
// payload_sha256 describe the whole, and the IDs that stay let a consumer
// read the rest through the API. conversation_id is the
// display ID the API's paths take: Chatwoot sends it as the id of a
// conversation_* event's payload and as conversation.id in message and
// typing events (conversation.display_id in older releases).
//
// # Not covered
//
// Documented but left out for now: account.update and automation rules
// (account administration), contact merge, contact.inbox.create and
// contactable inboxes, and assignment as a catalogue entry
// (cap:chatwoot:conversation:handoff makes it). In the reference's
// catalogue but not in the published document (swagger.json), against
// which every request is checked, so not offered: agent.bulk_create,
// agent.assignable.list, macros, conversation delete, search,
// unread_counts, mute, unmute, transcript, unread and attachment.list,
// message.update, translate and retry, contact active, import, export and
// notes. Also not covered: inbox, team, label and custom attribute administration
// (create/update/delete), agent bots, portals, integrations, webhooks
// and reports (operator surfaces), multipart uploads (attachments,
// avatars), the Platform and Client (public) APIs, tenant credential
// routing, and reconciliation of outcome_unknown actions (no Reconciler:
// Chatwoot offers no lookup by idempotency key; an operator can search the
// conversation for content_attributes.aip_action_id).
package chatwoot
