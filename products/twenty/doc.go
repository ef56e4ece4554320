// Package twenty is the product adapter for Twenty (CRM): an AIP
// connector for one Twenty workspace, over the REST API the workspace's
// schema generates, and a verified route for Twenty's signed webhooks.
//
// Twenty publishes no static API document. Its reference page
// (products/internal/spectest/specs/twenty/api.mdx) says the Core API for
// records lives under /rest/ with one path per object named by its plural
// API name (GET /rest/people?fields=...), the Metadata API under
// /rest/metadata/, authentication is "Authorization: Bearer <API key>",
// record endpoints take fields and depth, and batches hold at most 60
// records. The adapter uses those paths. What the page does not spell out
// comes from Twenty's generated REST API (reference upstream-aip-core.md
// §8.6): the batch path /rest/batch/<object>, the list parameters filter,
// order_by, limit, starting_after and ending_before, and the answers
// {"data":{<name>:...},"pageInfo":{...},"totalCount":n}. The adapter does
// not depend on the member names inside data beyond the list's
// (<object>) and the metadata list's (objects): single-record answers
// hold exactly one member, whatever Twenty names it.
//
// # Capabilities
//
// Capability IDs are cap:twenty:<operation>; every input names the object
// ("object", one of the configured plural names) except metadata.list:
//
//   - cap:twenty:record.list: GET /rest/<object> with filter, order_by,
//     limit (1..200), starting_after or ending_before, fields, depth;
//     returns {object, records, page_info, total_count}.
//   - cap:twenty:record.get: GET /rest/<object>/<id> (fields, depth);
//     returns {object, record}.
//   - cap:twenty:record.create: POST /rest/<object> with the record.
//   - cap:twenty:record.update: PATCH /rest/<object>/<id> with the fields
//     to change.
//   - cap:twenty:record.soft_delete: DELETE /rest/<object>/<id>?soft_delete=true
//     (Twenty keeps the record as deleted; it can be restored there; without
//     soft_delete=true Twenty would delete it permanently).
//   - cap:twenty:record.create_many: POST /rest/batch/<object> with 1 to 60
//     records; returns {object, records}.
//   - cap:twenty:metadata.list: GET /rest/metadata/objects (limit,
//     starting_after); returns {objects, page_info, total_count}.
//
// Record bodies are free-form JSON objects (the workspace's schema decides
// their fields), at most MaxRecordFields fields and MaxRecordBytes of JSON
// each (a larger one fails with twenty.record_too_large). Record IDs are
// UUIDs. The mutations (create, update, soft_delete, create_many) send the
// action's idempotency key as Idempotency-Key and its ID as
// X-AIP-Action-ID. None requires human approval (the reference reserves
// that for destroy and metadata changes, which this adapter does not
// offer).
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
//   - --twenty-allow-insecure-http (AIP_TWENTY_ALLOW_INSECURE_HTTP): accept
//     plain http to a private-network server (a host name or a private IP
//     address; a public IP address is still refused).
//   - --twenty-max-response-bytes (AIP_TWENTY_MAX_RESPONSE_BYTES): largest
//     answer read (default 64 MiB, at most 256 MiB).
//   - --twenty-objects (AIP_TWENTY_OBJECTS): the objects the capabilities
//     accept, comma-separated plural API names matching
//     [a-z][A-Za-z0-9]{0,62} (default people,companies,opportunities,
//     notes,tasks).
//
// # Errors
//
// Provider errors go through provider.Result: 400 and 422 are
// provider.invalid_request, 401 provider.unauthorized, 403
// provider.forbidden, 404 (an unknown object or record)
// provider.not_found, 429 provider.rate_limited (retryable, Retry-After
// kept; Twenty allows 100 requests a minute), 5xx and no answer
// provider.unavailable (retryable) for reads. A mutation that got a 5xx,
// no answer, or a 2xx answer of the wrong shape may have been applied: it
// is journaled outcome_unknown and never sent again. A read's 2xx answer
// of the wrong shape is provider.bad_response.
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
// constant time) and X-Twenty-Webhook-Nonce (32 hex digits, not signed);
// the timestamp must be within 300 000 ms of the host's clock. A missing
// header is 400 webhook.missing_header, a malformed timestamp or one out of
// the window 400 webhook.invalid_timestamp, a bad signature 401
// webhook.authentication_failed. Deliveries are fenced against replay by
// hex sha256(timestamp ":" signature ":" body) (signature lowercased) in
// state namespace aip.connector.twenty.webhook_replay.v1, key
// instance:<instance id>, for twice the skew window; a delivery seen
// before is refused with 401 webhook.authentication_failed, and a full
// fence (ReplayCapacity deliveries within the window) refuses new ones
// with 503 webhook.storage_unavailable. The payload must hold eventName,
// workspaceId (the configured workspace), webhookId (a UUID) and eventDate
// (RFC 3339), else 400 webhook.invalid_delivery. Each delivery is one
// event on channel twenty-webhooks: kind twenty.<eventName>, ID evt_ and
// the hex of the first 16 bytes of sha256(workspace ":" webhookId ":"
// body), occurred_at the eventDate, data the payload.
//
// # Not covered
//
// Deliberately left out: find_duplicates, group_by, update_many,
// soft_delete_many, destroy (hard delete), restore, merge, ingest, metadata
// get/create/update/delete, the OpenAPI documents, GraphQL, and everything
// the reference excludes (admin, auth, billing, workspace management, AI,
// workflows, MCP). Twenty's per-workspace OpenAPI is not fetched: the
// adapter does not validate record fields against the workspace schema;
// Twenty does, and its 400 comes back as provider.invalid_request.
package twenty
