package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"

	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

func eventsCommand() *command {
	return &command{
		name:      "events",
		summary:   "read a tenant's connector events from the dispatcher",
		usage:     "list [flags]",
		envPrefix: "AIP_CLIENT_",
		long: `Reads the tenant's event log from the dispatcher (GET /aip/v1/events,
docs/dispatch-api.md): the provider events its connectors' hosts delivered,
in the order the fleet stored them. The tenant is the token's.

  aipfleet events list                  the first --limit events
  aipfleet events list --after N        the events after sequence N
  aipfleet events list --follow         every event, then new ones as they arrive

Each line is: sequence, occurred_at, channel, kind, event ID, data (--json:
one JSON object per line, as the dispatcher answers it). Without --follow
one page is printed; when more events exist the last line says which
--after reads on. --follow pages through to the end, then asks again every
--interval until interrupted; a request that gets no answer, a 5xx or a 429
(the dispatcher restarting or busy) is reported on stderr and asked again,
any other refusal ends it. The dispatcher and the token are chosen as
for aipfleet action: --url (by default aipfleet dev's dispatcher, found
through --dev-state-dir) with --ca-file for a private CA, and --token,
--tenant with --issuer-key, or the token aipfleet dev wrote in
--dev-state-dir. --follow outlasts its token:
one minted with --issuer-key (it lasts 15 minutes) is minted again, and
aipfleet dev's is read again, shortly before it expires; a --token is used
as given.`,
		examples: []string{
			`aipfleet events list   # against aipfleet dev`,
			`aipfleet events list --after 120 --limit 50 --token "$TOKEN"`,
			`aipfleet events list --follow --json --tenant acme --issuer-key issuer.key`,
		},
		run: runEvents,
	}
}

// eventsFlags are the parsed flags of aipfleet events.
type eventsFlags struct {
	client   actionFlags // --url, the token and --json
	after    uint64
	limit    int
	follow   bool
	interval time.Duration
}

func runEvents(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	cf := bindClientFlags(fs)
	after := fs.String("after", "0", "print the events after this sequence (a previous page's last)")
	limit := fs.Int("limit", dispatch.DefaultEventPageLimit, "events per page (1 to "+strconv.Itoa(registry.MaxEventPage)+")")
	follow := fs.Bool("follow", false, "page through to the end, then wait for new events until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "with --follow: how often to ask for new events")
	reqTimeout := fs.Duration("request-timeout", 30*time.Second, "bound on each HTTP request")
	jsonOut := fs.Bool("json", false, "print each event as the dispatcher's JSON, one per line")
	fs.NoEnv("after")
	fs.NoEnv("follow")

	if _, err := fs.subcommand(args, e.stdout, "list"); err != nil {
		return err
	}
	if err := fs.parse(args[1:], e.stdout); err != nil {
		return err
	}
	if rest := fs.args(); len(rest) > 0 {
		return usagef("events list: unexpected argument %q; the start goes in --after", rest[0])
	}
	if err := clientFlagsNotEmpty(fs, "events list"); err != nil {
		return err
	}
	f := &eventsFlags{limit: *limit, follow: *follow, interval: *interval,
		client: actionFlags{requestTimeout: *reqTimeout, jsonOut: *jsonOut, command: "events list"}}
	cf.fill(&f.client)
	var err error
	if f.after, err = strconv.ParseUint(*after, 10, 64); err != nil {
		return usagef("events list: --after %q: want an event sequence, an integer from 0", *after)
	}
	switch {
	case f.limit < 1 || f.limit > registry.MaxEventPage:
		return usagef("events list: --limit %d: want 1 to %d", f.limit, registry.MaxEventPage)
	case f.interval <= 0:
		return usagef("events list: --interval must be positive")
	case fs.given["interval"] > 0 && !f.follow:
		// Without --follow one page is read: the interval would be
		// ignored. (Its variable is a setting for --follow, and quiet.)
		return usagef("events list: --interval is for --follow, which asks again every interval; add --follow")
	case f.client.requestTimeout <= 0:
		return usagef("events list: --request-timeout must be positive")
	}
	if err := f.client.findURL(fs); err != nil {
		return err
	}
	client, err := f.client.httpClient()
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	return f.list(ctx, client, e)
}

// tokenRenewBefore: a token of --follow that expires within this is
// replaced before the next request.
const tokenRenewBefore = time.Minute

// list prints pages from --after on: one page, or with --follow every page
// and then new events until ctx ends. --follow outlasts its token: one
// minted with --issuer-key (it lasts mintedTokenTTL) is minted again, and
// aipfleet dev's is read again, before it expires; a --token is the
// caller's to renew.
func (f *eventsFlags) list(ctx context.Context, client *http.Client, e *env) error {
	bearer, err := f.client.bearer()
	if err != nil {
		return err
	}
	after := f.after
	for {
		if f.follow && f.client.token == "" {
			if exp, ok := tenanttoken.UnverifiedExpiry(bearer); ok && !exp.After(f.client.clock().Add(tokenRenewBefore)) {
				if bearer, err = f.client.bearer(); err != nil {
					return err
				}
			}
		}
		page, err := f.page(ctx, client, bearer, after)
		if err != nil {
			if f.follow && ctx.Err() != nil {
				return nil // interrupted
			}
			var te *transientError
			if !f.follow || !errors.As(err, &te) {
				return err
			}
			// The dispatcher is restarting or overloaded: keep following.
			fmt.Fprintf(e.stderr, "events list: %v; asking again in %s\n", err, f.interval)
			if !sleepCtx(ctx, f.interval) {
				return nil
			}
			continue
		}
		for _, ev := range page.Events {
			if f.client.jsonOut {
				raw, _ := json.Marshal(ev)
				fmt.Fprintf(e.stdout, "%s\n", raw)
				continue
			}
			fmt.Fprintf(e.stdout, "%d %s %s %s %s %s\n", ev.Sequence, ev.Event.OccurredAt, printable(ev.ChannelID), printable(ev.Event.Kind),
				printable(ev.Event.ID), printable(compact(ev.Event.Data)))
		}
		if len(page.Events) == 0 && !f.follow {
			fmt.Fprintf(e.stderr, "no events after sequence %d\n", after)
		}
		after = page.NextAfter
		switch {
		case page.More && f.follow:
			continue
		case page.More:
			fmt.Fprintf(e.stderr, "more events: aipfleet events list --after %d\n", after)
			return nil
		case !f.follow:
			return nil
		}
		if !sleepCtx(ctx, f.interval) {
			return nil
		}
	}
}

// sleepCtx waits d, or less when ctx ends first; it reports whether the
// whole wait passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// transientError is a failed request worth asking again (no answer, a 5xx
// or a 429): --follow reports it and keeps following.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// printable returns s with every rune a terminal could act on (control
// characters such as ESC or a newline, format characters such as bidi
// overrides) written as a JSON \u escape: an event's kind and data come
// from a provider, and must not move the cursor, rewrite the screen or
// forge lines of this output. JSON text stays valid JSON.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, "\\u%04x\\u%04x", r1, r2)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

// continuationIndent starts every line after the first of a multi-line
// message printableLines prints.
const continuationIndent = "    "

// printableLines is printable for a message meant to be read as text (an
// error message from a replica or the dispatcher): its line breaks (\n or
// \r\n) start a new line indented by continuationIndent, so the message
// reads as it was written and no line of it can pass for a line of this
// output; every other control or format character is still escaped.
// Trailing line breaks are dropped.
func printableLines(s string) string {
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(s, "\r\n", "\n"), "\n"), "\n")
	for i, l := range lines {
		lines[i] = printable(l)
	}
	return strings.Join(lines, "\n"+continuationIndent)
}

// page reads one page of events after after.
func (f *eventsFlags) page(ctx context.Context, client *http.Client, bearer string, after uint64) (dispatch.EventsResponse, error) {
	var out dispatch.EventsResponse
	ctx, cancel := context.WithTimeout(ctx, f.client.requestTimeout)
	defer cancel()
	q := url.Values{"after": {strconv.FormatUint(after, 10)}, "limit": {strconv.Itoa(f.limit)}}
	resp, err := f.client.do(ctx, client, bearer, http.MethodGet, dispatch.PathEvents+"?"+q.Encode(), nil)
	var cert *untrustedCertError
	var plain *plainHTTPError
	if errors.As(err, &cert) || errors.As(err, &plain) {
		return out, err // asking again does not make the certificate trusted, nor the URL https://
	}
	if err != nil {
		return out, &transientError{err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 512<<20))
	if errors.As(err, &plain) {
		return out, fmt.Errorf("read the answer: %w", err)
	}
	if err != nil {
		return out, &transientError{fmt.Errorf("read the answer: %w", err)}
	}
	if resp.StatusCode != http.StatusOK {
		err := f.client.failure(resp.StatusCode, raw)
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			err = &transientError{err}
		}
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("the dispatcher's answer is not a page of events: %v", err)
	}
	return out, nil
}
