// Package twenty is the product adapter for Twenty (CRM): an AIP
// connector for one Twenty workspace, over the REST API the workspace's
// schema generates, and a verified route for Twenty's signed webhooks.
//
// Twenty publishes no static API document. Its reference page
// (products/internal/spectest/specs/twenty/api.mdx) says the Core API for
// records lives under /rest/ with one path per object named by its plural
// API name (GET /rest/people?fields=...), the Metadata API under
// /rest/metadata/, authentication is "Authorization: Bearer <API key>",
// record endpoints take fields and depth, and batches ("create, update, or
// delete") hold at most 60 records. The adapter uses those paths. What the
// page does not spell out comes from Twenty's generated REST API (the
// OpenAPI document each workspace serves at /rest/open-api/core; reference
// upstream-aip-core.md §8.6 names the operations): the batch path
// /rest/batch/<object>; the list parameters filter, order_by, limit,
// starting_after and ending_before; the filter forms of update and delete
// (PATCH and DELETE /rest/<object>?filter=..., soft_delete); restore
// (PATCH /rest/restore/<object>/<id> and /rest/restore/<object>?filter=...);
// POST /rest/<object>/duplicates with {"ids":[...]} or {"data":[...]};
// PATCH /rest/<object>/merge with {"ids","conflictPriorityIndex","dryRun"};
// GET /rest/<object>/groupBy?group_by=<JSON array> (its group_by parameter
// is parsed as JSON by Twenty's REST layer); GET
// /rest/metadata/<objects|fields>[/<id>]; GET /rest/open-api/core and
// /rest/open-api/metadata; and the answers {"data":{<name>:...},
// "pageInfo":{...},"totalCount":n} (duplicates: {"data":[...]}; the OpenAPI
// documents: the document itself). The adapter does not depend on the
// member names inside data beyond the lists' (<object>, objects, fields):
// answers hold exactly one member, whatever Twenty names it (person,
// createPerson, updatePeople, deletePeople, restorePerson, mergePeople,
// peopleGroupBy, object, field).
//
// # Capabilities
//
// Capability IDs are cap:twenty:<operation>; every record input names the
// object ("object", one of the configured plural names). A filter is
// Twenty's filter expression (e.g. id[in]:["<uuid>","<uuid>"] or
// city[eq]:"Paris"), 1 to 8 KiB; the filter forms require one, so a batch
// never addresses a whole object by omission. A filter can still match a
// whole object (id[is]:NOT_NULL), so update_many, soft_delete_many,
// restore_many and destroy_many first count its matches (GET
// /rest/<object>?filter=...&limit=1, totalCount) and refuse more than
// MaxFilterMatches (60, api.mdx's batch size) with
// twenty.too_many_matches, sending nothing; a failed count is a failed
// read. A list leaves soft-deleted records out unless its filter names
// deletedAt, but Twenty's mutations by filter apply the filter alone, to
// soft-deleted matches too (an update sets their fields, a soft delete
// deletes them again, a permanent delete removes them; a restore restores
// every match, live ones included, and answers them all), so the count is
// taken with and(<filter>,or(deletedAt[is]:NULL,deletedAt[is]:NOT_NULL)),
// the same matches, soft-deleted ones included, and the mutation sends
// that same filter. To act on live records only, add deletedAt[is]:NULL
// to the filter (deletedAt[is]:NOT_NULL for soft-deleted ones only); a
// soft delete or restore then answers no records, as Twenty answers with
// what the filter selects after the change.
//
// Twenty's filter parser splits and(...) at its commas outside brackets
// and quotes, with no escapes: a filter with an unpaired " or ' (an
// apostrophe in a value, O'Brien), an odd number of [ and ], a ) that
// closes nothing or a ( left open, or that starts with and(, or( or not(
// closed before its end (or(a),and(b), which Twenty alone reads as one
// mangled condition) could put the added condition inside a value or
// itself beside it, and be counted as matching nothing while acting on
// everything: it is refused with connector_host.input_invalid before any
// request. Records created or deleted between the count and the mutation
// are not counted.
//
// Reads (retry-safe, no idempotency headers):
//
//   - record.list: GET /rest/<object> with filter, order_by,
//     limit (1..200), starting_after or ending_before, fields, depth;
//     returns {object, records, page_info, total_count}.
//   - record.get: GET /rest/<object>/<id> (fields, depth);
//     returns {object, record}.
//   - record.find_duplicates: POST /rest/<object>/duplicates (depth) with
//     1 to 60 record IDs (sent as ids) or 1 to 60 records not yet created
//     (sent as data), one or the other; a POST that changes nothing
//     (Twenty answers 200); returns {object, duplicates}, one entry per
//     input: {totalCount, pageInfo, <singular>Duplicates}.
//   - record.group_by: GET /rest/<object>/groupBy with group_by (1 to 16
//     entries, each {"<field>": true}, {"<field>": {"<sub-field>": true}}
//     or {"<date field>": {"granularity": "DAY"}}; at most 4 KiB as JSON,
//     sent compacted), filter and limit (1..200); returns {object,
//     groups}, each {groupByDimensionValues, <aggregates>}. Twenty's other
//     group-by parameters (order_by in its group-by form, view_id,
//     include_records_sample, aggregate selections) are not offered.
//   - metadata.list: GET /rest/metadata/objects (limit, starting_after);
//     returns {objects, page_info, total_count}.
//   - metadata.fields: GET /rest/metadata/fields (limit, starting_after);
//     returns {fields, page_info, total_count}.
//   - metadata.get: GET /rest/metadata/<resource>/<id>, resource objects or
//     fields; returns {resource, item}.
//   - openapi.core and openapi.metadata: GET /rest/open-api/core and
//     /rest/open-api/metadata, the OpenAPI documents Twenty generates for
//     the key's workspace; returns {document} (a JSON object with an
//     "openapi" version, else provider.bad_response). Twenty answers a
//     key it does not accept with 200 and its anonymous base document,
//     whose only path is /open-api/<name>: that fails with
//     provider.unauthorized.
//
// api.mdx: without fields, a record of an object with more than 200
// fields comes back with only 200 of them, and the answer carries
// X-Twenty-Fields-Capped: true and X-Twenty-Fields-Max: 200. Every output
// carrying records (the reads' and the mutations') then adds
// fields_capped: true and fields_max, so that a field missing from a
// record is not taken for one without a value; record.list and
// record.get read the others when fields lists them.
//
// Mutations (an idempotency key required; never retried):
//
//   - record.create: POST /rest/<object> with the record.
//   - record.create_many: POST /rest/batch/<object> with 1 to 60
//     records; returns {object, records}.
//   - record.ingest: POST /rest/<object>?upsert=true with one record
//     carrying its id (a UUID the caller chooses) and only fields the
//     idempotent ingest policy lists for the object: Twenty creates it,
//     or updates the record with that id, so sending it again changes
//     nothing more. Returns {object, record}. Twenty's upsert matches
//     existing records, soft-deleted ones included, by id and by the
//     object's unique fields (a person's emails, a company's domainName,
//     custom fields marked unique; its create-many query runner,
//     getConflictingFields and getMatchingRecordId): a record whose unique
//     field holds another record's value updates that record, whatever
//     id it carries, and a soft-deleted match is restored. Leave unique
//     fields out of the policy to keep ingest to the records whose ids
//     the caller chose.
//   - record.ingest_many: POST /rest/batch/<object>?upsert=true with 1 to
//     the object's maxBatchRecords such records, their ids distinct;
//     returns {object, records}. The batch is not atomic: Twenty updates
//     the records it finds, then inserts the others in a separate
//     statement with no transaction around the two
//     (CommonCreateManyQueryRunnerService's performUpsertOperation), so an
//     insert the database refuses (a unique, not-null or foreign-key
//     constraint, 400 in later Twenty versions) leaves the updates
//     written. A 4xx to a batch of 2 or more records, other than 401,
//     403, 404 and 429 (answered before anything is written), is
//     therefore outcome_unknown, saying to read the batch's records by id
//     before acting on it again; a one-record batch's 4xx stays a failed
//     result.
//   - record.update: PATCH /rest/<object>/<id> with the fields to change.
//   - record.update_many (risk high): PATCH /rest/<object>?filter=... with
//     the fields to set on every match, soft-deleted ones included;
//     returns {object, records}.
//   - record.soft_delete: DELETE /rest/<object>/<id>?soft_delete=true
//     (Twenty keeps the record as deleted; it can be restored; without
//     soft_delete=true Twenty would delete it permanently).
//   - record.soft_delete_many (risk high): DELETE
//     /rest/<object>?filter=...&soft_delete=true (a soft-deleted match is
//     deleted again: its deletedAt is set anew); returns {object, records}
//     (the deleted records' IDs).
//   - record.restore: PATCH /rest/restore/<object>/<id>, no body; returns
//     {object, record}. Some Twenty versions refuse this path with 400
//     (twentyhq/twenty#23034, fixed upstream); that comes back as
//     provider.invalid_request, and record.restore_many with
//     id[eq]:<uuid> does the same.
//   - record.restore_many: PATCH /rest/restore/<object>?filter=..., no
//     body; returns {object, records}: every match, live ones included
//     (Twenty sets their deletedAt to NULL too, and announces them as
//     restored). These restore paths are the ones
//     the generated OpenAPI document publishes; twentyhq/twenty#24544
//     (merged 2026-08) moves restore to suffix paths
//     (/rest/<object>/<id>/restore, /rest/<object>/restore). Against a
//     server on that form the two restores may fail with a provider error;
//     openapi.core shows which form the workspace serves.
//   - record.merge (risk critical): PATCH /rest/<object>/merge (depth) with
//     {"ids": 2 to 60 distinct IDs, "conflictPriorityIndex": the index in
//     ids of the record kept, "dryRun"}; Twenty merges the others' values
//     and relations into it and deletes them (people softly, other objects
//     permanently in recent Twenty versions: a merge cannot be undone);
//     with dry_run it changes nothing and returns a preview under a new ID
//     with deletedAt set. Returns {object, record}.
//   - record.destroy (risk critical): DELETE
//     /rest/<object>/<id>?soft_delete=false, a permanent delete.
//   - record.destroy_many (risk critical): DELETE
//     /rest/<object>?filter=...&soft_delete=false; returns {object,
//     records} (the deleted IDs).
//
// record.destroy, record.destroy_many and record.merge cannot be undone
// (a merge deletes the merged-away records, permanently but for people),
// and record.ingest and record.ingest_many write without naming the
// fields in the action's schema beyond the policy: all five are offered
// only when --twenty-operations-file lists them (the ingests also need the
// policy); by default every other operation is offered. An operation not offered
// is absent from the manifest and refused (twenty.unknown_capability).
//
// The ingest input schemas carry the policy (per object: the allowed
// fields, id required, at most maxBatchRecords records), so the host
// refuses anything else with 400 input_invalid; the connector checks the
// same again, and that ids in a batch are distinct. The reference counts
// ingest among the retry-safe mutations; here it keeps the mutation
// contract of the others (an unknown outcome is journaled, not retried),
// though a replay of the same records would be harmless at Twenty.
//
// Record bodies are free-form JSON objects (the workspace's schema decides
// their fields), at most MaxRecordFields fields and MaxRecordBytes of JSON
// each (a larger one fails with twenty.record_too_large). Record IDs are
// UUIDs. The mutations send Idempotency-Key: "aip1-" and the hex SHA-256
// of [tenant ID, capability ID, the action's idempotency key]
// (provider.ScopedIdempotencyKey; the same for a retry of the same action,
// never the caller's key as it is, since one Twenty server and key may
// serve several tenants' hosts and a control character cannot go in a
// header), and the action's ID as X-AIP-Action-ID. None requires human
// approval: the irreversible ones are gated by the operator's operations
// list instead, and declare risk critical.
//
// # Settings
//
//   - --twenty-base-url (AIP_TWENTY_BASE_URL): the server, https (http to
//     loopback); required.
//   - --twenty-workspace-id (AIP_TWENTY_WORKSPACE_ID): the workspace, an
//     RFC 4122 UUID v1-v5; required. It names the agent
//     (agent:twenty:<workspace id>) and must match webhook payloads.
//   - --twenty-api-token-file (AIP_TWENTY_API_TOKEN_FILE): owner-only file
//     with the API key; required.
//   - --twenty-webhook-secret-file (AIP_TWENTY_WEBHOOK_SECRET_FILE):
//     owner-only file with the webhook secret; optional, enables the route.
//   - --twenty-webhook-previous-secret-file
//     (AIP_TWENTY_WEBHOOK_PREVIOUS_SECRET_FILE): owner-only file with the
//     secret being replaced, which verifies deliveries too while Twenty
//     switches to the new one (see Webhooks); needs the secret file and
//     must differ from it.
//   - The token and webhook secret files must read at start and are then
//     followed (provider.ReadSecret): one rewritten, or renamed over, is
//     used without a restart (checked at most once a second, and at once
//     when Twenty answers 401 or 403 or a delivery does not verify); a
//     file that cannot be read again keeps the value read before and is
//     logged at warn, naming the setting and the file.
//   - --twenty-allow-insecure-http (AIP_TWENTY_ALLOW_INSECURE_HTTP): accept
//     plain http to a private-network server (a host name or a private IP
//     address; a public IP address is still refused).
//   - --twenty-max-response-bytes (AIP_TWENTY_MAX_RESPONSE_BYTES): largest
//     answer read (default 64 MiB, at most 256 MiB).
//   - --twenty-objects (AIP_TWENTY_OBJECTS): the objects the capabilities
//     accept, comma-separated plural API names matching
//     [a-z][A-Za-z0-9]{0,62} (default people,companies,opportunities,
//     notes,tasks). batch, metadata and restore are refused: they are
//     REST path segments of Twenty's own.
//   - --twenty-operations-file (AIP_TWENTY_OPERATIONS_FILE): a JSON array
//     of the operations to offer (e.g. ["record.list","record.destroy"]),
//     in a file not writable by group or others, at most 128 KiB; unknown
//     or repeated names and an empty array are errors. Default: every
//     operation but record.destroy, record.destroy_many, record.ingest
//     and record.ingest_many.
//   - --twenty-idempotent-ingest-policy-file
//     (AIP_TWENTY_IDEMPOTENT_INGEST_POLICY_FILE): the idempotent ingest
//     policy, a JSON object in a file not writable by group or others, at
//     most 1 MiB, unknown members refused:
//     {"version":"aip.twenty.idempotent-ingest-policy/v1","objects":
//     {"<plural object>":{"fields":["<field>",...],"maxBatchRecords":n}}}.
//     1 to 128 objects, each one of --twenty-objects; 1 or more distinct
//     field API names each (not id, which is always required), 2 048 in
//     all; maxBatchRecords 1 to 60, default 60 (the reference's default is
//     200, but api.mdx allows 60 records per call and the adapter does not
//     split batches). Required when the ingests are listed; alone it
//     offers nothing.
//
// # Errors
//
// Provider errors go through provider.Result: 400 and 422 are
// provider.invalid_request, 401 provider.unauthorized, 403
// provider.forbidden, 404 (an unknown object or record)
// provider.not_found, 429 provider.rate_limited (retryable, Retry-After
// kept; Twenty allows 100 requests a minute), 5xx and no answer
// provider.unavailable (retryable) for reads. A mutation that got a 5xx,
// no answer, or a 2xx answer of the wrong shape (not JSON, no data, or
// records that are not one object or one array of objects) may have been
// applied: it is journaled outcome_unknown and never sent again. A read's
// 2xx answer of the wrong shape (a list, duplicates or groups that are not
// an array of objects, a pageInfo that is not an object) is
// provider.bad_response. Inputs the schema cannot
// check (a conflict_priority_index past the ids, a group_by over 4 KiB)
// fail with connector_host.input_invalid before any request.
//
// So does an input holding the character U+0000 anywhere (a record's
// value or member name, a filter; mutations and reads alike), naming
// where (provider.RefuseNUL). Twenty keeps records in PostgreSQL through
// TypeORM and node-postgres: the server refuses the character in a text
// parameter (invalid byte sequence for encoding "UTF8": 0x00, SQLSTATE
// 22021) and its escape in jsonb (22P05), and Twenty's REST API answers
// that refusal with a 500: computeTwentyORMException turns a recognised
// SQLSTATE into a PostgresException, which the REST layer maps to 500
// (as twentyhq/twenty#21632, 2026-06, describes it; later Twenty code
// answers class 22 and 23 errors with 400 INVALID_INPUT instead, to which
// the refusal only spares the round trip). A 500 to a mutation would be
// outcome_unknown though nothing was written, and to a read a retryable
// failure that can never succeed.
//
// CheckHealth reads one record of the first configured object
// (GET /rest/<object>?limit=1): a wrong key, an unreachable server or a
// first object the workspace does not have makes the replica not ready.
//
// # Webhooks
//
// With a webhook secret, POST /webhooks/twenty accepts Twenty's signed
// deliveries (body at most 4 MiB). It requires X-Twenty-Webhook-Timestamp
// (decimal Unix milliseconds, at most 32 digits), X-Twenty-Webhook-Signature
// (64 hex digits: HMAC-SHA256(secret, "<timestamp>:<raw body>"), compared in
// constant time with the webhook secret and, when
// --twenty-webhook-previous-secret-file is set, with that one too, both
// always computed; a delivery verified by the previous secret is logged
// at info when it starts a streak, and the first verified by the current
// one after such a streak too: webhook.Secrets) and
// X-Twenty-Webhook-Nonce (32 hex digits, not signed);
// the timestamp must be within 300 000 ms of the host's clock. A missing
// header is 400 webhook.missing_header, a malformed timestamp or one out of
// the window 400 webhook.invalid_timestamp, a bad signature 401
// webhook.authentication_failed. Deliveries are fenced against replay by
// hex sha256(timestamp ":" signature ":" body) (signature lowercased) in
// state namespace aip.connector.twenty.webhook_replay.v1, key
// instance:<instance id>, for twice the skew window; a delivery seen
// before is refused with 401 webhook.authentication_failed. A delivery
// whose event is stored is accepted even when the fence cannot record it
// (a storage failure, or a full fence: ReplayCapacity deliveries within
// the window); a replay of it maps to the same event, which the outbox
// stores once. The payload must hold eventName,
// workspaceId (the configured workspace), webhookId (a UUID) and eventDate
// (RFC 3339), else 400 webhook.invalid_delivery; so is a delivery whose
// event the host refuses for its content (hostsdk.ErrInvalidEvents, such
// as a NUL character), which would be refused again if sent again; an
// eventDate more than five minutes ahead of the host's clock is 503
// webhook.invalid_timestamp (the host's clock may be the wrong one). Each
// delivery is one event on channel twenty-webhooks: kind
// twenty.<eventName>, ID hostsdk.DeriveEventID of the eventDate, the
// workspace, the webhookId and the body, occurred_at the eventDate, data
// the payload. A payload whose event would exceed hostsdk.MaxEventBytes
// (a long note or task body, which Twenty sends twice: bodyV2.blocknote
// and bodyV2.markdown) is cut down to 192 KiB rather than refused: its
// largest members are left out, largest first (the record's fields but
// its id; the payload's members but eventName, workspaceId, webhookId,
// eventDate, objectMetadata and record), payload_omitted lists them
// ("record.bodyV2", ...), payload_bytes and payload_sha256 describe the
// whole body, and the record's id lets a consumer read the rest.
//
// Twenty (CallWebhookJob, packages/twenty-server) posts one delivery per
// record event and webhook: the job's data without its secret
// (targetUrl, eventName, objectMetadata, workspaceId, webhookId,
// eventDate, userId?, workspaceMemberId?, record, updatedFields?) as the
// JSON it signs, with a 5 s timeout, and never delivers it again: any
// error answer, or none, is recorded as a failed call in its audit log.
// A delivery this route refuses is lost; after an outage read the
// records (record.list with a filter on updatedAt). So every refusal of a
// delivery whose signature verified is logged at warn with what names it
// (event_name, webhook_id, event_date, record_id) and why: a timestamp
// out of the window (with clock_offset, the replica's clock minus the
// timestamp, and a reminder to check the host's clock: a replica whose
// clock is more than five minutes off refuses every delivery), another
// workspace, a payload that cannot be mapped or cut down to fit, an event
// the host does not store (a full outbox, a replica draining:
// webhook.Refusals.PublishFailed); so is a signature that does not
// verify (what a secret differing from Twenty's looks like). Each kind is
// logged at most once a minute, the next line counting those not logged
// (not_logged_since: webhook.Refusals).
//
// # Not covered
//
// Deliberately left out: metadata create/update/delete (schema changes; the reference
// rates them critical) and the metadata resources other than objects and
// fields (views, page layouts, webhooks, ...), GraphQL (batch upserts),
// the upsert query parameter outside record.ingest[_many], and everything the reference excludes
// (admin, auth, billing, workspace management, AI, workflows, MCP). The
// adapter does not validate record fields or filters against the
// workspace schema; Twenty does, and its 400 comes back as
// provider.invalid_request.
package twenty
