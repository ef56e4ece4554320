// Package calcom is the Cal.diy adapter: Cal.diy (the community,
// self-hosted fork of Cal.com) through its Cal.com API v2, as an AIP
// connector. cmd/aip-host runs it as "aip-host cal-diy".
//
// # Capabilities
//
// Agent agent:cal-diy, profiles aip.native.http.v1 and
// aip.connector.cal_diy.v1. Capability IDs are cap:cal_diy:<suffix>; each
// is one call of the published API document
// (products/internal/spectest/specs/cal-diy/openapi.json), with the
// cal-api-version that document requires for it:
//
//	profile.get         GET  /v2/me                                (no cal-api-version)
//	event_type.list     GET  /v2/event-types                       2024-06-14
//	event_type.get      GET  /v2/event-types/{eventTypeId}         2024-06-14
//	slot.list           GET  /v2/slots                             2024-09-04
//	booking.list        GET  /v2/bookings                          2024-08-13
//	booking.get         GET  /v2/bookings/{bookingUid}             2024-08-13
//	booking.create      POST /v2/bookings                          2024-08-13  mutation
//	booking.cancel      POST /v2/bookings/{bookingUid}/cancel      2024-08-13  mutation
//	booking.reschedule  POST /v2/bookings/{bookingUid}/reschedule  2024-08-13  mutation
//	booking.confirm     POST /v2/bookings/{bookingUid}/confirm     2024-08-13  mutation
//	booking.decline     POST /v2/bookings/{bookingUid}/decline     2024-08-13  mutation
//	schedule.list       GET  /v2/schedules                         2024-06-11
//
//	event_type.create        POST   /v2/event-types                                 2024-06-14  mutation
//	event_type.update        PATCH  /v2/event-types/{eventTypeId}                   2024-06-14  mutation
//	event_type.delete        DELETE /v2/event-types/{eventTypeId}                   2024-06-14  mutation, high risk
//	schedule.default.get     GET    /v2/schedules/default                           2024-06-11
//	schedule.get             GET    /v2/schedules/{scheduleId}                      2024-06-11
//	schedule.create          POST   /v2/schedules                                   2024-06-11  mutation
//	schedule.update          PATCH  /v2/schedules/{scheduleId}                      2024-06-11  mutation
//	schedule.delete          DELETE /v2/schedules/{scheduleId}                      2024-06-11  mutation, high risk
//	slot.reservation.create  POST   /v2/slots/reservations                          2024-09-04  mutation
//	slot.reservation.get     GET    /v2/slots/reservations/{uid}                    2024-09-04
//	slot.reservation.update  PATCH  /v2/slots/reservations/{uid}                    2024-09-04  mutation
//	slot.reservation.delete  DELETE /v2/slots/reservations/{uid}                    2024-09-04  mutation, high risk
//	booking.attendee.list    GET    /v2/bookings/{bookingUid}/attendees             2024-08-13
//	booking.attendee.add     POST   /v2/bookings/{bookingUid}/attendees             2024-08-13  mutation
//	booking.attendee.get     GET    /v2/bookings/{bookingUid}/attendees/{attendeeId} 2024-08-13
//	booking.guest.add        POST   /v2/bookings/{bookingUid}/guests                2024-08-13  mutation
//	booking.mark_absent      POST   /v2/bookings/{bookingUid}/mark-absent           2024-08-13  mutation
//	booking.reassign         POST   /v2/bookings/{bookingUid}/reassign              2024-08-13  mutation
//	booking.location.update  PATCH  /v2/bookings/{bookingUid}/location              2024-08-13  mutation
//	booking.get_by_seat      GET    /v2/bookings/by-seat/{seatUid}                  2024-08-13
//	booking.calendar_links.get GET  /v2/bookings/{bookingUid}/calendar-links        2024-08-13
//	booking.reference.list   GET    /v2/bookings/{bookingUid}/references            2024-08-13
//	booking.recording.list   GET    /v2/bookings/{bookingUid}/recordings            2024-08-13
//	booking.transcript.list  GET    /v2/bookings/{bookingUid}/transcripts           2024-08-13
//	calendar.list            GET    /v2/calendars                                   (none)
//	calendar.busy_time.list  GET    /v2/calendars/busy-times                        (none)
//	conferencing.list        GET    /v2/conferencing                                (none)
//	conferencing.default.get GET    /v2/conferencing/default                        (none)
//	webhook.list             GET    /v2/webhooks                                    (none)
//	webhook.get              GET    /v2/webhooks/{webhookId}                        (none)
//	webhook.create           POST   /v2/webhooks                                    (none)      mutation
//	webhook.update           PATCH  /v2/webhooks/{webhookId}                        (none)      mutation
//	webhook.delete           DELETE /v2/webhooks/{webhookId}                        (none)      mutation, high risk
//	profile.update           PATCH  /v2/me                                          (none)      mutation
//
//	booking.reassign_to_user          POST   /v2/bookings/{bookingUid}/reassign/{userId}      2024-08-13  mutation
//	booking.conferencing_session.list GET    /v2/bookings/{bookingUid}/conferencing-sessions  2024-08-13
//	conferencing.default.set          POST   /v2/conferencing/{app}/default                   (none)      mutation
//	conferencing.connect              POST   /v2/conferencing/{app}/connect                   (none)      mutation
//	conferencing.disconnect           DELETE /v2/conferencing/{app}/disconnect                (none)      mutation, high risk
//	event_type.private_link.list      GET    /v2/event-types/{eventTypeId}/private-links          (none)
//	event_type.private_link.create    POST   /v2/event-types/{eventTypeId}/private-links          (none)  mutation
//	event_type.private_link.update    PATCH  /v2/event-types/{eventTypeId}/private-links/{linkId} (none)  mutation
//	event_type.private_link.delete    DELETE /v2/event-types/{eventTypeId}/private-links/{linkId} (none)  mutation, high risk
//	event_type.webhook.list           GET    /v2/event-types/{eventTypeId}/webhooks               (none)
//	event_type.webhook.get            GET    /v2/event-types/{eventTypeId}/webhooks/{webhookId}   (none)
//	event_type.webhook.create         POST   /v2/event-types/{eventTypeId}/webhooks               (none)  mutation
//	event_type.webhook.update         PATCH  /v2/event-types/{eventTypeId}/webhooks/{webhookId}   (none)  mutation
//	event_type.webhook.delete         DELETE /v2/event-types/{eventTypeId}/webhooks/{webhookId}   (none)  mutation, high risk
//	event_type.webhook.delete_all     DELETE /v2/event-types/{eventTypeId}/webhooks               (none)  mutation, high risk
//	calendar.provider.check           GET    /v2/calendars/{calendar}/check                       (none)
//	calendar.disconnect               POST   /v2/calendars/{calendar}/disconnect                  (none)  mutation, high risk
//	calendar.ics_feed.check           GET    /v2/calendars/ics-feed/check                         (none)
//	calendar.destination.update       PUT    /v2/destination-calendars                            (none)  mutation
//	calendar.selected.add             POST   /v2/selected-calendars                               (none)  mutation
//	calendar.selected.delete          DELETE /v2/selected-calendars                               (none)  mutation, high risk
//	calendar.event.update             PATCH  /v2/calendars/{calendar}/events/{eventUid}           (none)  mutation
//
// The reference sends cal-api-version 2024-04-15 to private links; the
// published document has no such header for them, and the adapter
// follows the document.
//
// For the attendee, guest and location operations the document gives the
// version only in the header's description ("Must be set to 2024-08-13");
// the test that checks versions against the document reads both.
// Every DELETE is risk high (calendar.selected.delete too: .add selects
// the calendar again, but bookings made meanwhile may conflict with it),
// as is calendar.disconnect; other mutations are medium, reads low.
// Updates need at least one field to change (minProperties).
//
// Inputs are snake_case (event_type_id, booking_uid, time_zone, ...) and
// strict (additionalProperties false, bounded strings and numbers); the
// adapter renames them to the provider's query parameters and body fields
// and sends list filters comma-separated (so a list item holding a comma,
// which Cal.diy would read as two, is refused as input_invalid and
// nothing is sent). An input holding the character U+0000 anywhere (a
// value or a member name, of a mutation or a read) is refused
// connector_host.input_invalid, naming where, before any request
// (provider.RefuseNUL): Cal.diy keeps its data in PostgreSQL through
// Prisma, and PostgreSQL refuses the character in text (invalid byte
// sequence for encoding "UTF8": 0x00, which Prisma passes on as an error:
// prisma/orm#21431); API v2's PrismaExceptionFilter
// (apps/api/v2/src/filters/prisma-exception.filter.ts) answers every
// Prisma error but P2002, P2025 and P2003 with a 500 ("There was an
// error, please try again later."; calcom/cal.diy#15073 tracks that), which
// a mutation could only report as outcome_unknown and a read as a
// retryable failure that never succeeds. An integer input spelled as another number (42.0,
// 4.2e1, which the schema's "integer" accepts) is sent as the integer
// (42): Cal.diy refuses a path ID "42.0" and reads some query parameters
// with parseInt, to which "4.2e1" is 4. The times that book, move or
// hold a meeting or bound a private link (booking.create and
// booking.reschedule start, slot reservations' slot_start, private links'
// expires_at, calendar.event.update's start and end time) must be RFC
// 3339 date-times with their zone, Z or an offset
// (2050-09-05T11:00:00+02:00, as slot.list answers with a time_zone):
// Cal.diy reads a time without a zone as UTC, which is not what a caller
// meaning the attendee's local time wanted. The time filters of slot.list
// (start, end) and booking.list (after_start, before_end and the
// created/updated bounds) take a date alone (read as UTC: slot.list from
// the start or to the end of that day) or such a zoned date-time; a
// date-time without its zone is refused there too. Cal.diy reads a zoned
// time's offset right (API v2's slots parse start and end with Luxon's
// DateTime.fromISO(value, {zone: "utc"}), which converts to UTC), so
// offsets go as given; but it takes an end at 00:00:00 UTC for a date
// alone and stretches it to 23:59:59 that day (adjustEndTime), so a
// slot.list end within the first second of a UTC day
// (2050-09-06T00:00:00Z, or 2050-09-06T02:00:00+02:00) is refused
// input_invalid, naming the date of the day before to give instead. The output is the provider's
// JSON answer as sent ({"status":"success","data":...}, with pagination on
// lists), except that webhook signing secrets are left out (see Webhook
// subscriptions). Upstream marks Cal.diy's mutations requires_human_approval; this
// fleet has no approval step that would hold them, so they are not marked
// (a manifest must not promise what no component enforces): restrict who
// may book or cancel through the tenant's capability bindings in the fleet
// file instead.
//
// Every request carries Authorization: Bearer <API key>, Accept:
// application/json, x-aip-action-id and x-aip-tenant-id; mutations also
// carry idempotency-key: "aip1-" and the hex SHA-256 of [tenant ID,
// capability ID, the action's idempotency key]
// (provider.ScopedIdempotencyKey), the same for a retry of the same
// action, never the caller's key as it is: one Cal.diy deployment and key
// may serve several tenants' hosts, whose equal keys must not meet, and a
// control character cannot go in a header. Cal.diy does not document an
// idempotency key of its own, so the header is informational: the host's
// journal is what keeps an action from running twice.
//
// # Webhook subscriptions
//
// webhook.create, webhook.update, event_type.webhook.create and
// event_type.webhook.update accept a subscriber URL only if it is exactly one of the
// --cal-diy-webhook-subscriber-prefixes followed by a subscription ID
// (the webhook route's syntax: 1 to 128 of A-Z a-z 0-9 . _ ~ -, the first
// alphanumeric). With no prefixes configured every subscriber URL is
// refused (deny by default). An update without subscriber_url keeps a
// URL that may have been set anywhere, so it may only switch the webhook
// off (active false alone); anything else (triggers, template, switching
// it on) must restate an allowed URL. A refused URL is a failed result
// cal_diy.subscriber_url_not_allowed (policy, not retryable) and nothing
// is sent. The signing secret is never an action input: when the
// connector holds the secret of that subscription
// (--cal-diy-webhook-secret-files) it sends it as the webhook's secret,
// so deliveries verify at POST /webhooks/cal-diy/{subscription_id};
// otherwise none is sent. Such a subscription takes no payload_template
// (failed result cal_diy.payload_template_refused, policy, nothing sent):
// the webhook route reads Cal.diy's default payload, and a template would
// make every delivery unreadable; an update pointing a webhook at such a
// subscription sends payloadTemplate "" (Cal.diy's default payload), since
// PATCH would keep a template set while the webhook pointed elsewhere.
// Every trigger is taken, MEETING_STARTED and MEETING_ENDED included
// (the route reads the shape Cal.diy's scheduler sends them in; see
// Webhook). Every webhook.* and
// event_type.webhook.* output leaves out the secret member of the webhook(s) Cal.diy returns, and an
// error quoting provider text (an error body, a status-error envelope)
// shows every configured signing secret as [redacted], like the API key.
//
// # Settings
//
//	--cal-diy-base-url / AIP_CAL_DIY_BASE_URL                  origin of the API, e.g. https://api.cal.com
//	                                                           (https; http only for loopback; no path)
//	--cal-diy-bearer-token-file / AIP_CAL_DIY_BEARER_TOKEN_FILE owner-only file with the API key (cal_...)
//	--cal-diy-max-response-bytes / AIP_CAL_DIY_MAX_RESPONSE_BYTES largest answer read (default 8 MiB, at most 64 MiB)
//	--cal-diy-webhook-secret-files / AIP_CAL_DIY_WEBHOOK_SECRET_FILES
//	                                                           comma list of SUBSCRIPTION_ID=FILE (optional)
//	--cal-diy-webhook-previous-secret-files / AIP_CAL_DIY_WEBHOOK_PREVIOUS_SECRET_FILES
//	                                                           comma list of SUBSCRIPTION_ID=FILE: the secret being
//	                                                           replaced of a subscription of the secret files, verified
//	                                                           too while Cal.diy switches (optional)
//	--cal-diy-webhook-subscriber-prefixes / AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES
//	                                                           comma list of https URL prefixes ending in / that
//	                                                           webhook.create/update and event_type.webhook.create/update
//	                                                           may register (optional; none: deny)
//
// The API key and webhook secret files must read at start and are then
// followed (provider.ReadSecret): a key or secret rewritten in its file is
// used without a restart (checked at most once a second, and at once when
// Cal.diy answers 401 or 403 or a delivery does not verify; a file that
// cannot be read again keeps the value read before and is logged). A
// webhook create or update sends the secret the file holds then.
//
// New refuses a missing or non-https base URL, an unreadable, empty or
// group/other-readable secret file, malformed subscription entries, a
// previous secret for a subscription without a secret or equal to it, and
// subscriber prefixes that are not https, carry user information, a
// query, a fragment, escapes or dot segments, or whose path does not end
// with / (more than 32 are refused too), naming the setting to fix.
//
// # Errors
//
// Provider answers map through provider.Result: 400/422 →
// provider.invalid_request, 401 → provider.unauthorized, 403 →
// provider.forbidden, 404 → provider.not_found, 409 → provider.conflict,
// 429 → provider.rate_limited (retryable, with Retry-After), 5xx, 408 or no
// answer → provider.unavailable (retryable) for reads. A 2xx answer whose
// body does not say "status":"success" ("error", another status, none,
// an empty body) fails a read with provider.bad_response (not retryable).
// A mutation whose request may have reached Cal.diy without a usable
// answer is outcome_unknown: the host journals it and never sends it
// again. That is a 5xx; a 408, which Cal.diy answers when work it started
// took too long; a dropped connection; a 2xx body that is unreadable,
// empty, not a JSON object or whose status is not success (Cal.diy took
// the request, and a failed result would invite booking or cancelling
// again).
//
// A recurring booking is not atomic. For a recurring event type POST
// /v2/bookings books the occurrences one after the other, each with its
// own call of the regular booking service and no transaction around them
// (RecurringBookingService's handleNewRecurringBooking in Cal.com's and
// Cal.diy's packages/features/bookings/lib/service/), and stops at the
// first occurrence it refuses, keeping those booked before it. Checks
// that depend on the occurrence run for each (the booking window,
// validateBookingTimeIsNotOutOfBounds; the booker's active bookings,
// checkActiveBookingsLimitForBooker; duration limits; only
// the first occurrence's availability is checked), and API v2 answers
// such a refusal with a 4xx (ErrorsBookingsService_2024_08_13 maps most to
// 400). The published document describes only the 201 answer, whose data
// is one booking or, for a series, an array of
// RecurringBookingOutput_2024_08_13 (passed on as sent). So a
// booking.create refused with a 4xx other than 404 (the event type, user
// or team was not found, before anything was booked) and 429 (the
// throttler's) is outcome_unknown when the booking may be recurring:
// recurrence_count 2 or more; or, without recurrence_count (Cal.diy then
// books the event type's own count), an event type that GET
// /v2/event-types/{eventTypeId} (or GET /v2/event-types?username=...&eventSlug=...)
// answers with a recurrence, that cannot be read, or that is given by
// team_slug (which the adapter does not look up). Its message says to
// list the attendee's bookings of the event type from start (booking.list)
// and cancel or keep them before booking again. A refusal of a single
// booking (recurrence_count 1, or an event type whose recurrence is null)
// stays a failed result. A booking.create that is outcome_unknown for
// another reason (a 5xx, no answer, an unreadable 2xx) says the same:
// the booking, and for a series all or some of its occurrences, may be
// booked; list the attendee's bookings before booking again. That needs
// no further request: recurrence_count says whether it is a series, and
// without it the message covers both (the event type is not read after
// an answer that was lost or a 5xx).
//
// CheckHealth is GET /v2/me.
//
// # Webhook
//
// With at least one subscription secret the host mounts
// POST /webhooks/cal-diy/{subscription_id} (body at most 1 MiB) and the
// manifest declares the channel cal-diy-webhooks. A delivery needs
// x-cal-signature-256, exactly 64 hex digits of HMAC-SHA256(subscription
// secret, raw body) compared in constant time (with the subscription's
// previous secret too, when --cal-diy-webhook-previous-secret-files gives
// one, both always computed; a delivery verified by the previous secret is
// logged at info when it starts a streak, and the first verified by the
// current one after such a streak too: webhook.Secrets; webhook creates
// and updates send only the current secret), and x-cal-webhook-version
// 2021-10-20; its body is {triggerEvent, createdAt, payload} with createdAt
// at most 24 hours old and at most 5 minutes ahead, or the scheduler's
// shape below. Answers: unknown subscription 404; missing header 400
// webhook.missing_header; bad
// signature 401 webhook.authentication_failed; bad shape or version 400
// webhook.invalid_delivery; a createdAt more than 24 hours old (a startTime
// or endTime in the scheduler's shape more than 25 hours old) 400
// webhook.invalid_timestamp, more than 5 minutes ahead of this replica's
// clock 503 webhook.invalid_timestamp (the replica's clock may be the
// wrong one, and a warning says to check it, as for any event time ahead
// of the clock); body larger than 1 MiB 413 webhook.too_large; outbox
// not accepting 503 webhook.storage_unavailable. Cal.diy delivers a
// webhook again for none of these answers, 503 included: sendPayload
// (packages/features/webhooks/lib/sendPayload.ts) returns the answer's
// status and its callers (WebhookService.processWebhooks, the booking
// handlers) only log a failure; with its task queue on
// (TASKER_ENABLE_WEBHOOKS=1) only a delivery that got no answer at all is
// tried again. A refused delivery is lost: give every replica a
// subscription's secret before the webhook points at the route, and read
// bookings (booking.list) after an outage.
//
// MEETING_STARTED and MEETING_ENDED come from Cal.diy's scheduler, not
// from sendPayload: scheduleTrigger
// (packages/features/webhooks/lib/scheduleTrigger.ts), when a booking is
// accepted, stores JSON.stringify({triggerEvent, ...booking}) to be sent
// at the booking's startTime (MEETING_STARTED) or endTime
// (MEETING_ENDED), and a cron job (handleWebhookScheduledTriggers.ts)
// POSTs that stored string once its time has come, signed as any
// delivery (x-cal-signature-256 over it with the webhook's secret,
// x-cal-webhook-version the webhook's version), never later than a day
// after that time (each run first deletes what is a day or more past), and
// deletes it whatever the answer. So such a body has no payload member, its
// createdAt is the booking's (days old by the meeting), and nothing in
// it is set at sending. The route reads it as it is sent: a
// MEETING_STARTED or MEETING_ENDED without a payload member must carry
// the booking's startTime or endTime (RFC 3339, as JSON writes a date),
// and that time stands for createdAt: it may be up to 25 hours old
// (WebhookScheduledMaxAge) and 5 minutes ahead, the replay fence keeps the
// delivery as long, and it is the event's time. (With a payload member,
// the body is read as any other.) The scheduler stores each such
// delivery with the subscriber URL the webhook had when the booking was
// accepted, and signs it when it sends it with the webhook's secret then
// (API v2's webhook update leaves the stored rows as they are). So after
// webhook.update moved a webhook from one subscription to another (which
// sends the new one's secret), the meetings booked before still come to
// the old subscription's URL, signed with the new one's secret: a
// delivery in the scheduler's shape (at most 64 KiB, MovedMaxBody, so
// that a forged one costs little) that its URL's subscription does not
// verify is checked against the other subscriptions' secrets, and one
// that verifies it is taken as that subscription's (its event's
// subscription_id, its fence ID), logged at info with
// url_subscription_id. That holds whether or not the old subscription is
// still in --cal-diy-webhook-secret-files: at the URL of a subscription
// the replica does not hold, only a signed scheduler-shape delivery of at
// most MovedMaxBody bytes is read and checked, and anything else (or one
// no secret verifies) is answered 404. Rows stored while the webhook
// pointed outside this connector go there. The hour beyond the
// scheduler's day is
// for a delivery it sends close to a day late, which reaches the route a
// little after (each run sends its rows one after the other, each after
// a DNS check and a delete), later still by this replica's clock when
// Cal.diy's is behind it: such a delivery was refused as more than 24
// hours old, and the scheduler never sends it again. Nothing in the body
// is set at sending, so the replay fence (its ID covers the signature and
// the body) is what keeps a copy of it from being taken twice within
// those 25 hours, and past them the age check refuses it. The published
// API document only lists the two among a webhook's triggers; it
// describes no delivery body.
//
// Every refusal of a delivery whose signature verified is logged at warn
// with its subscription, trigger and why (a shape the route cannot read,
// such as a MEETING_STARTED of the scheduler's shape without a startTime;
// a time out of the window, with clock_offset, the replica's clock minus
// that time, and a reminder to check the host's clock); so are an unknown
// subscription, a body over 1 MiB and a signature that does not verify (what a
// subscription missing from the replica or a secret differing from
// Cal.diy's looks like). Each kind is logged at most once a minute, the
// next line counting those not logged (not_logged_since:
// webhook.Refusals). A verified delivery is
// fenced against replays in the host's state store (namespace
// aip.connector.cal_diy.webhook_replay.v1, key instance:<instance_id>,
// ID = hex SHA-256 of subscription, version, signature and body; window
// 25 hours + 5 minutes, as long as a time ahead of the clock stays
// acceptable in the scheduler's shape (ReplayWindow); 4096 deliveries,
// the oldest forgotten first); a duplicate is
// answered 200 with "duplicate": true. Otherwise it becomes one event of
// kind cal_diy.<trigger event lowercased> (cal_diy.booking_created, ...;
// cal_diy.meeting_started and cal_diy.meeting_ended for the scheduler's;
// data: subscription_id, trigger_event, created_at, webhook_version,
// payload) whose ID is derived from the fence ID and whose occurred_at is
// the delivery's time, so a redelivery past the fence still stores one
// batch. For the scheduler's shape, created_at and occurred_at are the
// booking's startTime or endTime as delivered and payload is the whole
// body as delivered (the booking as Cal.diy stores it, its ID in id, with
// triggerEvent; the booking's createdAt is payload's). A payload whose
// event would exceed hostsdk.MaxEventBytes (256 KiB: a booking with long
// notes or many responses) is cut down to 192 KiB rather than refused, as
// Chatwoot's and Twenty's routes do (webhook.TrimPayload): its largest
// members are left out, largest first, never uid, bookingId, eventTypeId,
// type, startTime, endTime and status (in the scheduler's shape never
// triggerEvent, id, uid, eventTypeId, userId, startTime, endTime and
// status); payload_omitted lists what was left out, payload_bytes and
// payload_sha256 describe the payload as delivered, and booking.get reads
// the rest. The event ID stays the whole delivery's.
//
// # Not covered
//
// Platform OAuth client credentials (x-cal-client-id and x-cal-secret-key)
// and managed-user tokens are out of scope: the adapter authenticates with
// one API key. (In the published document only POST /v2/bookings, GET
// /v2/event-types and POST /v2/slots/reservations accept client
// credentials; every other endpoint the adapter serves requires
// Authorization.) Nor are tenant credential routing or a dispatch ledger for
// reconciliation offered. booking.create does not take a location,
// instant or routing, and cancel and reschedule do not take a seat UID:
// the published document's oneOf alternatives for those bodies overlap
// (no discriminator, no additionalProperties false), so such a body
// cannot be shown to match exactly one of them.
//
// Of the reference's 81 operations these are not offered yet:
// booking.attendee.delete, calendar.connection.list,
// calendar.connection.event.*, calendar.connection.free_busy.get,
// calendar.event.list|create|delete and calendar.free_busy.get (the
// published document has none of those routes); calendar.event.get (the
// document has it only under the deprecated singular
// /v2/calendars/{calendar}/event/{eventUid}, which the reference
// excludes). The
// operator-only surfaces the reference excludes (OAuth clients and
// flows, API key refresh, calendar and conferencing OAuth, Stripe,
// verified resources) stay out.
//
// Some inputs are narrower than the document's bodies: schedule.create
// and schedule.update
// take no availability or overrides, because the document's
// ScheduleAvailabilityInput and ScheduleOverrideInput cannot be
// satisfied (days is an array whose enum lists strings; startTime and
// endTime carry the literal pattern TIME_FORMAT_HH_MM); event_type.create
// and event_type.update leave out booking fields, locations, limits,
// windows, recurrence, seats and other object-valued settings, and the
// success redirect URL; calendar.event.update does not replace the
// attendee list (the document's attendees field replaces every attendee);
// profile.update is the document's UpdateManagedUserInput without email:
// the account's email is its sign-in identity (password resets go to
// it, and a platform-managed user's change applies at once), so an agent
// changing it could take the account over; the operator changes it.
package calcom
