package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// DefaultDispatchURL is the dispatcher's URL the action command uses
// unless --url says otherwise: dispatch's default --bind.
const DefaultDispatchURL = "http://" + dispatch.DefaultAddr

func actionCommand() *command {
	return &command{
		name:      "action",
		summary:   "send an action to the dispatcher, read its state, cancel it",
		usage:     "send|get|cancel [flags]",
		envPrefix: "AIP_CLIENT_",
		long: `The client of the dispatcher's API (docs/dispatch-api.md):
  aipfleet action send --capability C --input JSON   run an action
  aipfleet action get ACTION_ID                      its route and journaled state
  aipfleet action cancel ACTION_ID                   cancel it on its pinned replica

The dispatcher is --url; without it (or its variable), the dispatcher of
the aipfleet dev fleet whose state is in --dev-state-dir, at the port dev
recorded there, else 127.0.0.1:8080. An https dispatcher whose certificate
your own CA signed needs that CA in --ca-file. The bearer token is --token,
or — with --tenant — a development token minted on the spot with the local
issuer key --issuer-key (the dispatcher must trust that key: aipfleet
dispatch --issuer NAME=DID, with NAME = --issuer). With neither, the token
aipfleet dev wrote in --dev-state-dir is used, so against a running
aipfleet dev no flag is needed. A send prints a readable summary (--json:
the dispatcher's JSON answer); it exits 1 when the action did not complete.
A get prints the action's route and its replica's journaled state; it exits
1 when that replica could not be asked (the route is still printed; the
state is unknown: run it again once the replica answers).
A cancel prints the same and exits 0 once the action is cancelled, 1 when it
completed or failed before the cancel reached it, or the cancel was refused.
Sending the same --action-id again returns the same action's result and
never runs it twice. A send whose outcome is open (its answer was lost,
dispatch.outcome_unknown, dispatch.timeout, a pinned replica that could not
be reached) says so and what to run: action get, or the same send again.`,
		examples: []string{
			`aipfleet action send --capability echo.say --input '{"message":"hi"}'   # against aipfleet dev`,
			`aipfleet action send --tenant acme --issuer-key issuer.key --capability echo.say --input '{"message":"hi"}'`,
			`AIP_CLIENT_TOKEN=$(aipfleet token --issuer-key issuer.key --tenant acme) aipfleet action send --capability echo.say --input '{"message":"hi"}' --json`,
			`aipfleet action send --capability echo.stream --mode streaming --input '{"message":"hi","chunks":3}' --token "$TOKEN"`,
			`aipfleet action get act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d --token "$TOKEN"`,
			`aipfleet action send --url https://dispatch.example.net:8443 --ca-file ca.pem --capability echo.say --input '{"message":"hi"}' --token "$TOKEN"`,
			`aipfleet action cancel act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d --reason "wrong recipient" --token "$TOKEN"`,
		},
		run: runAction,
	}
}

// actionFlags are the parsed client flags.
type actionFlags struct {
	url, token, tenant, issuerKey, issuer, audience string
	capability, input, inputFile, actionID, mode    string
	idempotencyKey, reason                          string
	devStateDir                                     string
	// caFile is --ca-file: an extra root CA for an https dispatcher.
	caFile         string
	timeoutMS      int
	requestTimeout time.Duration
	jsonOut        bool
	// command names the command in usage errors as the user typed it:
	// "action send", "events list", "capability get"; "" is action.
	command string
	// urlFrom is the dev.json url was read from, "" when url was given or
	// is the default (devDefaultURL).
	urlFrom string
	// urlDefault says why url is the default: no dev fleet's state in
	// --dev-state-dir (noDevStateNote); "" when url was given or read
	// from a dev.json.
	urlDefault string
	// clientGiven lists the client flags (bindClientFlags) given on the
	// command line, for hints that name another client command
	// (sameFlags).
	clientGiven []string
	// now is the clock tokens are minted and checked by; nil is
	// time.Now.
	now func() time.Time
}

// clock returns the time now.
func (f *actionFlags) clock() time.Time {
	if f.now != nil {
		return f.now()
	}
	return time.Now()
}

// commandName is the command the flags belong to, for usage errors.
func (f *actionFlags) commandName() string {
	if f.command == "" {
		return "action"
	}
	return f.command
}

// clientFlags are the flags every dispatcher client command (action,
// events) shares: the dispatcher, the CA it is trusted by and how to get a
// token.
type clientFlags struct {
	url, token, tenant, issuerKey, issuer, audience, devStateDir, caFile *string
}

func bindClientFlags(fs *flagSet) clientFlags {
	return clientFlags{
		url:         fs.String("url", DefaultDispatchURL, "the dispatcher's base URL"),
		token:       fs.String("token", "", "bearer token (see aipfleet token)"),
		tenant:      fs.String("tenant", "", "mint a development token for this tenant with --issuer-key"),
		issuerKey:   fs.String("issuer-key", "", "local issuer key file used with --tenant (mode 0600)"),
		issuer:      fs.String("issuer", "aipfleet-dev", "issuer name of minted tokens"),
		audience:    fs.String("audience", tenanttoken.DefaultAudience, "audience of minted tokens"),
		devStateDir: fs.String("dev-state-dir", DefaultDevStateDir, "aipfleet dev's state directory: without --url, its dispatcher (dev.json); without --token or --tenant, its token (dev-token)"),
		caFile:      fs.String("ca-file", "", "extra PEM root CA for an https dispatcher (aipfleet dispatch --tls-cert-file signed by a private CA)"),
	}
}

// clientFlagsNotEmpty refuses an empty --token, --tenant, --issuer-key or
// --dev-state-dir given on the command line (flagSet.notEmpty).
func clientFlagsNotEmpty(fs *flagSet, cmd string) error {
	return fs.notEmpty(cmd, map[string]string{
		"token":         "give the token, or leave --token out to use aipfleet dev's",
		"tenant":        "give the tenant, or leave --tenant out to use aipfleet dev's token",
		"issuer-key":    "give the issuer key file, or leave --issuer-key out",
		"dev-state-dir": "give aipfleet dev's state directory, or leave the flag out for " + DefaultDevStateDir,
	})
}

// fill copies the parsed client flags into f.
func (c clientFlags) fill(f *actionFlags) {
	f.url, f.token, f.tenant, f.issuerKey, f.issuer, f.audience, f.devStateDir, f.caFile =
		*c.url, *c.token, *c.tenant, *c.issuerKey, *c.issuer, *c.audience, *c.devStateDir, *c.caFile
}

// httpClient is the client of the dispatcher's API: one connection at a
// time, trusting --ca-file's roots besides the system's, through the proxy
// the environment names (HTTPS_PROXY, NO_PROXY), as before --ca-file.
func (f *actionFlags) httpClient() (*http.Client, error) {
	c, err := tlsClient(f.commandName(), "--ca-file", f.caFile, 2, 2)
	if err != nil {
		return nil, err
	}
	c.Transport.(*http.Transport).Proxy = http.ProxyFromEnvironment
	return c, nil
}

func runAction(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	f := &actionFlags{}
	cf := bindClientFlags(fs)
	capability := fs.String("capability", "", "send: the capability ID")
	input := fs.String("input", "", "send: the input as JSON")
	inputFile := fs.String("input-file", "", "send: read the input JSON from this file (- for stdin)")
	actionID := fs.String("action-id", "", "send: the action ID, act_ and a UUIDv7 in hex (act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d; the one of an earlier send to retry it); a new one when empty, named in every answer or error")
	mode := fs.String("mode", "sync", "send: sync or streaming")
	idem := fs.String("idempotency-key", "", "send: idempotency key passed to the connector")
	timeoutMS := fs.Int("timeout-ms", 0, "send: the action's timeout in ms (0: the dispatcher's default)")
	reason := fs.String("reason", "", "cancel: the reason")
	reqTimeout := fs.Duration("request-timeout", 6*time.Minute, "bound on the whole HTTP request")
	jsonOut := fs.Bool("json", false, "print the dispatcher's JSON answer")
	fs.NoEnv("capability")
	fs.NoEnv("input")
	fs.NoEnv("input-file")
	fs.NoEnv("action-id")
	fs.NoEnv("idempotency-key")
	fs.NoEnv("reason")

	sub, err := fs.subcommand(args, e.stdout, "send", "get", "cancel")
	if err != nil {
		return err
	}
	// Flags may come before or after the positional arguments.
	rest, err := fs.parseInterleaved(args[1:], e.stdout)
	if err != nil {
		return err
	}
	if err := clientFlagsNotEmpty(fs, "action "+sub); err != nil {
		return err
	}
	*f = actionFlags{command: "action " + sub, capability: *capability, input: *input, inputFile: *inputFile, actionID: *actionID, mode: *mode,
		idempotencyKey: *idem, reason: *reason, timeoutMS: *timeoutMS, requestTimeout: *reqTimeout, jsonOut: *jsonOut}
	cf.fill(f)
	if err := f.findURL(fs); err != nil {
		return err
	}
	if f.requestTimeout <= 0 {
		// A request with no time at all is never sent, yet a send would
		// be reported as one that may have run.
		return usagef("action %s: --request-timeout must be positive", sub)
	}
	switch sub {
	case "send":
		if len(rest) > 0 {
			return usagef("action send: unexpected argument %q; the input goes in --input", rest[0])
		}
		// The ID is chosen here, not by the dispatcher, so that a send
		// whose answer is lost (a broken connection, Ctrl-C, the request
		// timeout) can still name the action to ask about or to retry.
		if f.actionID == "" {
			f.actionID = aip.NewActionID()
		} else if err := checkActionID("action send", "--action-id", f.actionID); err != nil {
			return err
		}
	case "get", "cancel":
		if len(rest) != 1 {
			return usagef("action %s: give exactly one action ID", sub)
		}
		if err := checkActionID("action "+sub, "action ID", rest[0]); err != nil {
			return err
		}
	default:
		return usagef("action: unknown subcommand %q; use send, get or cancel", sub)
	}
	// A flag of another subcommand would be ignored: an --input given to
	// get, a --reason to send. (Their variables, where they have one, are
	// shared settings and stay quiet.)
	for _, only := range []struct{ flag, sub string }{
		{"capability", "send"}, {"input", "send"}, {"input-file", "send"}, {"action-id", "send"}, {"mode", "send"},
		{"idempotency-key", "send"}, {"timeout-ms", "send"}, {"reason", "cancel"},
	} {
		if only.sub != sub && fs.given[only.flag] > 0 {
			return usagef("action %s: --%s is for action %s", sub, only.flag, only.sub)
		}
	}
	bearer, err := f.bearer()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.requestTimeout)
	defer cancel()
	client, err := f.httpClient()
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	switch sub {
	case "send":
		return f.send(ctx, client, bearer, e)
	case "get":
		return f.get(ctx, client, bearer, rest[0], e)
	}
	return f.cancel(ctx, client, bearer, rest[0], e)
}

// findURL sets f.url from --url, else from the dev fleet's state in
// --dev-state-dir (devDefaultURL), else the default, and checks it.
func (f *actionFlags) findURL(fs *flagSet) error {
	for _, name := range []string{"url", "ca-file", "token", "tenant", "issuer-key", "issuer", "audience", "dev-state-dir"} {
		if fs.given[name] > 0 {
			f.clientGiven = append(f.clientGiven, "--"+name)
		}
	}
	var err error
	if f.urlFrom, err = devDefaultURL(fs, "url", &f.url, f.devStateDir, func(u devURLs) string { return u.dispatch }); err != nil {
		return err
	}
	if f.urlFrom == "" && !fs.isSet("url") {
		f.urlDefault = noDevStateNote(f.devStateDir)
	}
	if f.url, err = baseURL("--url", f.url, DefaultDispatchURL); err != nil {
		return usagef("%s: %v", f.commandName(), err)
	}
	return nil
}

// bearer returns the token to send: --token, or one minted for --tenant.
func (f *actionFlags) bearer() (string, error) {
	switch {
	case f.token != "" && f.tenant != "":
		return "", usagef("%s: give either --token or --tenant (with --issuer-key), not both", f.commandName())
	case f.token != "":
		return f.token, nil
	case f.tenant == "":
		return f.devToken()
	case f.issuerKey == "":
		return "", usagef("%s: --tenant needs --issuer-key FILE (a local issuer key the dispatcher trusts), or use --token", f.commandName())
	}
	if err := tenantFlagValid(f.commandName(), f.tenant); err != nil {
		return "", err
	}
	for _, n := range [][2]string{{"issuer", f.issuer}, {"audience", f.audience}} {
		if err := mintedNameGiven(f.commandName(), n[0], n[1]); err != nil {
			return "", err
		}
	}
	key, err := aip.LoadSigningKey(f.issuerKey)
	if err != nil {
		return "", flagFileError(f.commandName(), "--issuer-key", err)
	}
	now := f.clock()
	// The subject names the top command ("aipfleet-action"), as before
	// usage errors named the subcommand.
	top, _, _ := strings.Cut(f.commandName(), " ")
	return tenanttoken.Mint(key, tenanttoken.Claims{Issuer: f.issuer, Audience: f.audience, TenantID: f.tenant,
		Subject: "aipfleet-" + top, IssuedAt: now, Expiry: now.Add(mintedTokenTTL)})
}

// mintedTokenTTL is how long a token minted with --issuer-key lasts.
const mintedTokenTTL = 15 * time.Minute

// devToken returns the token aipfleet dev wrote for its tenant.
func (f *actionFlags) devToken() (string, error) {
	file := filepath.Join(f.devStateDir, devTokenFile)
	raw, err := aip.ReadSecretFile(file, tenanttoken.MaxTokenBytes+2)
	if errors.Is(err, os.ErrNotExist) {
		note := noDevStateNote(f.devStateDir)
		if note != "" {
			note = "\n(" + note + ")"
		}
		return "", usagef("%s: a token is needed: --token TOKEN ($AIP_CLIENT_TOKEN), or --tenant T with --issuer-key FILE; with a running aipfleet dev, its token in %s is used (none there now: start aipfleet dev, or point --dev-state-dir at its state)%s",
			f.commandName(), file, note)
	}
	switch {
	case errors.Is(err, aip.ErrUnsafeFile), errors.Is(err, aip.ErrEmptyFile), errors.Is(err, os.ErrPermission):
		// A token file others may read or replace, or not one dev
		// wrote: a setting to fix, which asking again cannot (exit 2).
		// It was "the dev token: ..." with exit status 1 and no fix
		// for what aip's error does not say (an empty file, one too
		// large).
		return "", flagFileError(f.commandName(), "aipfleet dev's token (in --dev-state-dir "+f.devStateDir+")",
			fmt.Errorf("%w\n(aipfleet dev writes a fresh token, mode 0600, each time it starts: restart it; or give --token TOKEN, or --tenant T with --issuer-key FILE)", err))
	case err != nil:
		return "", fmt.Errorf("%s: read aipfleet dev's token (in --dev-state-dir %s): %w", f.commandName(), f.devStateDir, err)
	}
	tok := strings.TrimSpace(string(raw))
	if exp, ok := tenanttoken.UnverifiedExpiry(tok); ok && !exp.After(f.clock()) {
		return "", fmt.Errorf("%s: the token aipfleet dev wrote in %s expired at %s (it lasts %s): restart aipfleet dev, which writes a fresh one, or pass --token, or --tenant with --issuer-key",
			f.commandName(), file, exp.Local().Format("2006-01-02 15:04"), devTokenTTL)
	}
	return tok, nil
}

func (f *actionFlags) send(ctx context.Context, client *http.Client, bearer string, e *env) error {
	if f.capability == "" {
		return usagef("action send: --capability is required")
	}
	raw := []byte(f.input)
	switch {
	case f.input != "" && f.inputFile != "":
		return usagef("action send: give --input or --input-file, not both")
	case f.inputFile == "-":
		var err error
		if raw, err = io.ReadAll(io.LimitReader(os.Stdin, dispatch.DefaultMaxBodyBytes+1)); err != nil {
			return fmt.Errorf("read the input from stdin: %w", err)
		}
		if len(raw) > dispatch.DefaultMaxBodyBytes {
			return usagef("action send: the input on stdin is more than the %d bytes allowed", dispatch.DefaultMaxBodyBytes)
		}
	case f.inputFile != "":
		var err error
		if raw, err = aip.ReadPublicFile(f.inputFile, dispatch.DefaultMaxBodyBytes); err != nil {
			return flagFileError("action send", "--input-file", err)
		}
	case f.input == "":
		return usagef("action send: --input JSON (or --input-file FILE) is required")
	}
	from := "--input-file " + f.inputFile
	switch f.inputFile {
	case "":
		from = "--input"
	case "-":
		from = "standard input (--input-file -)"
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return usagef("action send: the input from %s is empty; it must be one JSON value, such as an object", from)
	}
	if err := jsonSyntax(raw); err != nil {
		if f.inputFile == "" {
			err = fmt.Errorf("%w (a shell may have eaten quotes: put the JSON in single quotes, or use --input-file)", err)
		}
		return usagef("action send: the input from %s is not valid JSON: %v", from, err)
	}
	req := dispatch.ActionRequest{ActionID: f.actionID, CapabilityID: f.capability, Input: raw,
		Mode: aip.ActionMode(f.mode), IdempotencyKey: f.idempotencyKey}
	if f.mode != string(aip.ModeSync) && f.mode != string(aip.ModeStreaming) {
		return usagef("action send: --mode %q: want sync or streaming", f.mode)
	}
	if f.timeoutMS < 0 {
		return usagef("action send: --timeout-ms must not be negative")
	}
	if f.timeoutMS > 0 {
		ms := uint64(f.timeoutMS)
		req.TimeoutMS = &ms
	}
	body, _ := json.Marshal(req)
	resp, err := f.do(ctx, client, bearer, http.MethodPost, dispatch.PathActions, body)
	if err != nil {
		return f.maybeRan(err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), dispatch.ContentTypeNDJSON) {
		err = f.readStream(resp.Body, e)
	} else {
		err = f.printAction(resp, e, f.actionID, true, actionErr)
	}
	var lost *answerLostError
	if errors.As(err, &lost) {
		return f.maybeRan(err)
	}
	return err
}

// exampleActionID is an action ID of the valid form, for errors that say
// what one looks like.
const exampleActionID = "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"

// checkActionID refuses, with a usage error of cmd, an action ID given on
// the command line that aip.ValidateID refuses. what names the argument
// ("action ID", or the flag "--action-id"); the error says what a valid
// ID looks like and where to get one: `action get foo` said only `"foo" must start with
// "act_"`, not that the action ID was wrong.
func checkActionID(cmd, what, id string) error {
	err := aip.ValidateID(aip.PrefixAction, id)
	if err == nil {
		return nil
	}
	form := fmt.Sprintf("%q and a UUIDv7 in 32 lowercase hex digits, like %s", aip.PrefixAction, exampleActionID)
	if what == "--action-id" {
		return usagef("%s: --action-id %v; give %s (the ID an earlier send printed, to retry it), or leave --action-id out for a new one",
			cmd, err, form)
	}
	return usagef("%s: %s %v; give the ID action send printed: %s", cmd, what, err, form)
}

// notFound adds to err, the failure of a get (cancel false) or cancel of
// action id, what the dispatcher's not_found means there: it knows no such
// action for the token's tenant. Right after a send whose answer was lost
// (whose error says to ask with action get), that is most often an action
// that never reached routing: nothing ran, and a send with the same ID
// runs it once. The note said only that the action may be another
// tenant's or another fleet's, and a cancel printed no note at all.
func (f *actionFlags) notFound(id string, cancel bool, err error, status int, raw []byte) error {
	var e dispatch.ErrorResponse
	if status != http.StatusNotFound || json.Unmarshal(raw, &e) != nil || e.Error == nil || e.Error.Code != dispatch.CodeNotFound {
		return err
	}
	id = printable(id)
	never := fmt.Sprintf("a send whose answer was lost may not have reached it: nothing ran; send it again with --action-id %s, which runs it at most once", id)
	if cancel {
		never = "a send whose answer was lost may not have reached it: nothing ran, and there is nothing to cancel"
	}
	return fmt.Errorf("action %s: %w\nthe dispatcher at %s has no action with this ID for the token's tenant: either it never routed one (%s), or the action is another tenant's or another fleet's (it is found only with a token of the tenant that sent it, at the dispatcher of the fleet that routed it)",
		id, err, f.url, never)
}

// answerLostError is a send whose answer did not arrive whole.
type answerLostError struct{ err error }

func (e *answerLostError) Error() string { return e.err.Error() }
func (e *answerLostError) Unwrap() error { return e.err }

// maybeRan adds to err, the failure of a send that may have reached the
// dispatcher, which action it was and how to learn its outcome safely. A
// send the dispatcher never received (nothing answers at --url, or its
// certificate was not trusted) needs no such note.
func (f *actionFlags) maybeRan(err error) error {
	var down *dispatcherDownError
	var cert *untrustedCertError
	var plain *plainHTTPError
	if errors.As(err, &down) || errors.As(err, &cert) || errors.As(err, &plain) {
		return err
	}
	return fmt.Errorf("%w\naction %s may or may not have run: ask with `aipfleet action get %s`, or send it again with --action-id %s (it never runs twice)",
		err, f.actionID, f.actionID, f.actionID)
}

// outcomeHint adds to err, the error of a send answered r, what to do when
// r's error leaves the action's outcome open (docs/dispatch-api.md,
// Retrying): the action may have run, or stays pinned to a replica that
// could not be reached. The dispatcher's messages name its API ("GET
// /aip/v1/actions/ID"), not the commands that ask, so a send answered
// dispatch.outcome_unknown ended on "aipfleet: action ...:
// dispatch.outcome_unknown" and left the reader to translate.
func (f *actionFlags) outcomeHint(err error, r *dispatch.ActionResponse) error {
	if err == nil || r.Error == nil {
		return err
	}
	switch r.Error.Code {
	case dispatch.CodeOutcomeUnknown, dispatch.CodeTimeout, dispatch.CodeInternal,
		hostsdk.CodeStorageUnavailable, hostsdk.CodeActionInProgress:
		return f.maybeRan(err)
	case dispatch.CodeReplicaUnreachable:
		if r.Error.Retryable == nil || !*r.Error.Retryable || r.Route == nil {
			// Settled cancelled: nothing ran, and the summary says so.
			return err
		}
		return fmt.Errorf("%w\naction %s stays pinned to replica %s, which could not be reached: send it again with --action-id %s once that replica answers again (its host started again on its own journal), and it runs at most once; `aipfleet action get %s` shows its journal state once it does",
			err, f.actionID, printable(r.Route.ReplicaID), f.actionID, f.actionID)
	}
	return err
}

// dispatcherDownError is a request nothing at --url accepted: it was
// never received.
type dispatcherDownError struct {
	url string
	// from is the dev.json url was read from, "" when it was not.
	from string
	// defaulted says why url is the default (actionFlags.urlDefault).
	defaulted string
	err       error
}

func (e *dispatcherDownError) Error() string {
	if e.from != "" {
		return fmt.Sprintf("no dispatcher answers at %s (connection refused)%s", e.url, devAddressNote(e.from, "url"))
	}
	msg := fmt.Sprintf("no dispatcher answers at %s (connection refused): start one (aipfleet dev, or aipfleet dispatch) or point --url at it", e.url)
	if e.defaulted != "" {
		msg += "\n(" + e.url + " is the default address: " + e.defaulted + ")"
	}
	return msg
}
func (e *dispatcherDownError) Unwrap() error { return e.err }

func (f *actionFlags) readStream(body io.Reader, e *env) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), dispatch.DefaultMaxBodyBytes+1)
	var final *dispatch.ActionResponse
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if f.jsonOut {
			fmt.Fprintf(e.stdout, "%s\n", line)
		}
		var l dispatch.StreamLine
		if err := json.Unmarshal(line, &l); err != nil {
			// The stream began: the action was admitted and may have run.
			return &answerLostError{fmt.Errorf("the dispatcher sent a line that is not JSON: %s", printable(aip.TruncateUTF8(string(line), 200)))}
		}
		switch {
		case l.Chunk != nil && !f.jsonOut:
			fmt.Fprintf(e.stdout, "chunk %d %s %s\n", l.Chunk.Sequence, printable(string(l.Chunk.Kind)), printable(compact(l.Chunk.Data)))
		case l.ActionResponse != nil:
			final = l.ActionResponse
		}
	}
	if err := sc.Err(); err != nil {
		return &answerLostError{fmt.Errorf("the stream broke: %w", err)}
	}
	if final == nil {
		return &answerLostError{errors.New("the stream ended without a result")}
	}
	if !f.jsonOut {
		printSummary(e.stdout, final, true)
	}
	return f.outcomeHint(f.capabilityHint(actionErr(final), final.Error), final)
}

// printAction prints the dispatcher's answer to a send (send true) or a
// cancel of action id and returns the command's error: judge's for an
// answer about the action.
func (f *actionFlags) printAction(resp *http.Response, e *env, id string, send bool, judge func(*dispatch.ActionResponse) error) error {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return &answerLostError{fmt.Errorf("read the answer: %w", err)}
	}
	var ar dispatch.ActionResponse
	if err := json.Unmarshal(raw, &ar); err != nil || (ar.ActionID == "" && ar.Error == nil) {
		// Not the dispatcher's answer: another server at --url (a 404,
		// with its hint), or a proxy in front of the dispatcher, whose
		// error (a 502, a 504 after its own timeout) says nothing of
		// whether the action ran: a send then names it (maybeRan).
		err := f.failure(resp.StatusCode, raw)
		if resp.StatusCode == http.StatusNotFound {
			return err
		}
		return &answerLostError{fmt.Errorf("%w (not an answer of the dispatcher's API)", err)}
	}
	if !send && resp.StatusCode == http.StatusNotFound && ar.Error != nil && ar.Error.Code == dispatch.CodeNotFound {
		// A cancel of an action the dispatcher does not know: there
		// is nothing to summarize ("not completed, settlement none"
		// read as an action that exists), only what not_found means.
		if f.jsonOut {
			e.stdout.Write(raw)
		}
		return f.notFound(id, true, f.failure(resp.StatusCode, raw), resp.StatusCode, raw)
	}
	if ar.ActionID == "" {
		// Refused before it became an action (a bad token, an invalid
		// request, an overload): there is no action to summarize.
		if f.jsonOut {
			e.stdout.Write(raw)
		}
		return f.failure(resp.StatusCode, raw)
	}
	if f.jsonOut {
		e.stdout.Write(raw)
	} else {
		printSummary(e.stdout, &ar, send)
	}
	err = f.capabilityHint(judge(&ar), ar.Error)
	if send {
		err = f.outcomeHint(err, &ar)
	}
	return err
}

func (f *actionFlags) get(ctx context.Context, client *http.Client, bearer, id string, e *env) error {
	resp, err := f.do(ctx, client, bearer, http.MethodGet, dispatch.PathActions+"/"+id, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return f.notFound(id, false, f.failure(resp.StatusCode, raw), resp.StatusCode, raw)
	}
	var st dispatch.ActionStatusResponse
	if f.jsonOut {
		e.stdout.Write(raw)
		if json.Unmarshal(raw, &st) == nil && st.Route != nil && !st.Replica.Reachable {
			return replicaNotAsked(&st)
		}
		return nil
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.Route == nil {
		return fmt.Errorf("the answer from %s is not an action status (is --url the dispatcher?): %s", f.url, printable(aip.TruncateUTF8(string(raw), 200)))
	}
	fmt.Fprintf(e.stdout, "action %s (%s)\n", st.ActionID, st.CapabilityID)
	fmt.Fprintf(e.stdout, "route:   replica %s (instance %s, version %s), fence %s, assigned %s\n", st.Route.ReplicaID,
		orNone(st.Route.InstanceID), orNone(st.Route.VersionID), st.Route.FenceToken, st.Route.AssignedAt.Format(time.RFC3339))
	for _, h := range st.History {
		fmt.Fprintf(e.stdout, "history: replica %s, fence %s (refused, not started)\n", h.ReplicaID, h.FenceToken)
	}
	if at := st.Reservation.HandedOutAt; at != nil {
		fmt.Fprintf(e.stdout, "capacity: reserved since %s (last handed out)\n", at.Format(time.RFC3339))
	} else {
		fmt.Fprintf(e.stdout, "capacity: reserved %t, last settlement %s\n", st.Reservation.Reserved, orNone(string(st.Reservation.LastSettlement)))
	}
	if !st.Replica.Reachable {
		msg := "no answer"
		if st.Replica.Error != nil {
			msg = printable(st.Replica.Error.Code) + ": " + printableLines(st.Replica.Error.Message)
		}
		fmt.Fprintf(e.stdout, "replica: unreachable (%s); its journal was not read, nothing is assumed\n", msg)
		fmt.Fprintf(e.stdout, "next:    the action stays pinned to %s (it is not moved, and never runs twice): once that replica answers again (its host started again on its own journal; `aipfleet fleet status` lists a replica that crashed as ready until its lease runs out), run this get again, or send the action again with --action-id %s%s\n",
			printable(st.Route.ReplicaID), printable(st.ActionID), f.sameFlags())
		return replicaNotAsked(&st)
	}
	fmt.Fprintf(e.stdout, "replica: journal state %s\n", printable(string(st.Replica.State)))
	if r := st.Replica.Result; r != nil {
		line := "result:  " + printable(string(r.Status))
		if len(r.Output) > 0 {
			line += " " + printable(compact(r.Output))
		}
		fmt.Fprintln(e.stdout, line)
		if r.Error != nil {
			fmt.Fprintf(e.stdout, "error:   %s: %s\n", printable(r.Error.Code), printableLines(r.Error.Message))
		}
	}
	return nil
}

// replicaNotAsked is the error of an action get whose pinned replica
// could not be asked (st.Replica.Reachable false): the route was printed,
// but the action's journaled state is unknown, so the command exits 1 for
// a script to tell.
func replicaNotAsked(st *dispatch.ActionStatusResponse) error {
	return fmt.Errorf("action get %s: its replica %s could not be asked, so the action's journaled state is unknown; run this get again once the replica answers",
		printable(st.ActionID), printable(st.Route.ReplicaID))
}

func (f *actionFlags) cancel(ctx context.Context, client *http.Client, bearer, id string, e *env) error {
	body, _ := json.Marshal(dispatch.CancelRequest{Reason: f.reason})
	resp, err := f.do(ctx, client, bearer, http.MethodPost, dispatch.PathActions+"/"+id+"/cancel", body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return f.printAction(resp, e, id, false, cancelErr)
}

func (f *actionFlags) do(ctx context.Context, client *http.Client, bearer, method, path string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, f.url+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, &dispatcherDownError{url: f.url, from: f.urlFrom, defaulted: f.urlDefault, err: err}
		}
		if cert := asUntrustedCert(err, "the dispatcher", f.url); cert != nil {
			return nil, cert
		}
		if speaksTLS(ctx, f.url, err) {
			return nil, &plainHTTPError{fmt.Errorf("%s %s: %w", method, f.url+path, unwrapURLError(err))}
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%s %s: no answer within --request-timeout %s (%w)", method, f.url+path, f.requestTimeout, context.Cause(ctx))
		}
		if ctx.Err() != nil {
			// Ctrl-C, not the dispatcher.
			return nil, fmt.Errorf("%s %s: stopped waiting for the answer (%w)", method, f.url+path, context.Cause(ctx))
		}
		return nil, fmt.Errorf("%s %s: %w", method, f.url+path, unwrapURLError(err))
	}
	resp.Body = &resetBody{ReadCloser: resp.Body, ctx: ctx, url: f.url}
	return resp, nil
}

// unwrapURLError drops the method and URL *url.Error repeats.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// printSummary prints the answer r to a send (send true) or a cancel. A
// send refused without running (an input the replica refused: settlement
// cancelled; a refusal before routing: no route) says so, not "settlement
// cancelled", which reads as if the action had been cancelled: that
// settlement only released the capacity reserved for it. A send whose
// result is cancelled names no settlement (see below). A cancel of an
// action that completed or failed before it says so and its outcome, not
// "settlement none" (the cancel settled nothing: the action's own
// settlement had).
func printSummary(w io.Writer, r *dispatch.ActionResponse, send bool) {
	where := ""
	if r.Route != nil {
		where = fmt.Sprintf(" on replica %s (fence %s", r.Route.ReplicaID, r.Route.FenceToken)
		if n := len(r.Route.Reroutes); n > 0 {
			where += fmt.Sprintf(", rerouted %s after %s", times(n), plural(n, "refusal"))
		}
		where += ")"
	}
	switch {
	case r.Result != nil:
		switch {
		case !send && r.Result.Status != aip.ResultCancelled:
			// Finished before the cancel reached it: the result is its
			// outcome, and the cancel settled nothing (no settlement).
			fmt.Fprintf(w, "action %s %s%s before the cancel reached it: nothing was cancelled\n", r.ActionID, r.Result.Status, where)
		case send && r.Result.Status == aip.ResultCancelled:
			// Stopped by a cancel (or cancelled by its connector): the
			// send's settlement is completed (a verified result came
			// back), even when the cancel released the reservation first
			// and `action cancel` and `action get` say cancelled, so
			// "cancelled ..., settlement completed" read as a
			// contradiction. The result is the outcome; `action get`
			// shows the reservation's settlement.
			fmt.Fprintf(w, "action %s cancelled%s\n", r.ActionID, where)
		default:
			fmt.Fprintf(w, "action %s %s%s, settlement %s\n", r.ActionID, r.Result.Status, where, orNone(string(r.Settlement)))
		}
		if len(r.Result.Output) > 0 {
			fmt.Fprintf(w, "output: %s\n", printable(compact(r.Result.Output)))
		}
		if r.Result.Error != nil {
			fmt.Fprintf(w, "error: %s: %s\n", printable(r.Result.Error.Code), printableLines(r.Result.Error.Message))
		}
	case r.Error != nil && send && r.Settlement == registry.SettlementCancelled:
		fmt.Fprintf(w, "action %s refused%s: nothing ran for this request\n", r.ActionID, where)
		fmt.Fprintf(w, "error: %s: %s\n", printable(r.Error.Code), printableLines(r.Error.Message))
	case r.Error != nil && send && r.Route == nil && r.Settlement == dispatch.SettlementNone:
		fmt.Fprintf(w, "action %s refused before routing: nothing ran\n", r.ActionID)
		fmt.Fprintf(w, "error: %s: %s\n", printable(r.Error.Code), printableLines(r.Error.Message))
	case r.Error != nil:
		fmt.Fprintf(w, "action %s not completed%s, settlement %s\n", r.ActionID, where, orNone(string(r.Settlement)))
		fmt.Fprintf(w, "error: %s: %s\n", printable(r.Error.Code), printableLines(r.Error.Message))
	}
}

// actionErr is the command's error for an answer that is not a completed
// result.
func actionErr(r *dispatch.ActionResponse) error {
	switch {
	case r.Error != nil:
		return fmt.Errorf("action %s: %s", r.ActionID, printable(r.Error.Code))
	case r.Result != nil && r.Result.Status != aip.ResultCompleted:
		return fmt.Errorf("action %s: %s", r.ActionID, r.Result.Status)
	}
	return nil
}

// cancelErr is the error of a cancel whose answer is r: none once the
// action is cancelled (by this cancel or an earlier one), so that a script
// can rely on the exit status; the result the action reached first (it
// completed or failed before the cancel got there) or the refusal
// otherwise.
func cancelErr(r *dispatch.ActionResponse) error {
	switch {
	case r.Error != nil:
		return fmt.Errorf("action %s: %s", r.ActionID, printable(r.Error.Code))
	case r.Result != nil && r.Result.Status != aip.ResultCancelled:
		return fmt.Errorf("action %s was not cancelled: its result is %s", r.ActionID, printable(string(r.Result.Status)))
	}
	return nil
}

// failure is apiFailure, plus a hint when the answer is a 404 no
// dispatcher gives: --url names some other server (the control plane, a
// replica, a proxy's wrong route); or a 401: what to check of the token,
// by where it came from.
func (f *actionFlags) failure(status int, raw []byte) error {
	err := apiFailure(status, raw)
	if status == http.StatusUnauthorized {
		return fmt.Errorf("%w\n%s", err, f.refusedHint())
	}
	var e dispatch.ErrorResponse
	decoded := json.Unmarshal(raw, &e) == nil && e.Error != nil
	if decoded && e.Error.Code == dispatch.CodeBindingUnavailable {
		return f.capabilityHint(err, e.Error)
	}
	if status == http.StatusNotFound && (!decoded ||
		!strings.HasPrefix(e.Error.Code, "dispatch.") && !strings.HasPrefix(e.Error.Code, "connector.")) {
		return fmt.Errorf("%w\n%s does not serve the dispatcher's API: is --url the dispatcher? (aipfleet dev prints its address; the control plane listens on another port)", err, f.url)
	}
	return err
}

// capabilityHint adds to err, the failure of a request the dispatcher
// answered with pe, how to find the capabilities the token's tenant can
// call when pe is connector.binding_unavailable: the dispatcher's message
// names its API path (GET /aip/v1/capabilities), not the command that
// reads it.
func (f *actionFlags) capabilityHint(err error, pe *aip.ProtocolError) error {
	if err == nil || pe == nil || pe.Code != dispatch.CodeBindingUnavailable {
		return err
	}
	what := "the capability"
	if f.capability != "" {
		what = "capability " + printable(f.capability)
	}
	return fmt.Errorf("%w\n%s is not available to the token's tenant (an unknown ID, perhaps in another case, or one not bound to this tenant): `aipfleet capability list` lists those it can call%s",
		err, what, f.sameFlags())
}

// sameFlags says, in a hint that names another client command, which
// client flags of this command line it needs too: " (with the same --url
// and --token)"; "" when none was given (their variables, if set, apply
// to the other command as well).
func (f *actionFlags) sameFlags() string {
	switch n := len(f.clientGiven); n {
	case 0:
		return ""
	case 1:
		return " (with the same " + f.clientGiven[0] + ")"
	default:
		return " (with the same " + strings.Join(f.clientGiven[:n-1], ", ") + " and " + f.clientGiven[n-1] + ")"
	}
}

// refusedHint says what to check when the dispatcher refuses the token
// (401), by where the token came from: --token, minted for --tenant with
// --issuer-key, or aipfleet dev's.
func (f *actionFlags) refusedHint() string {
	switch {
	case f.token != "":
		return fmt.Sprintf("%s refused the token of --token: check that it trusts the token's issuer and key (aipfleet dispatch --issuer NAME=DID), that the token names its --audience, and that the token has not expired", f.url)
	case f.tenant != "":
		return fmt.Sprintf("%s refused the token minted with --issuer-key %s: check that it trusts that key under the name %s (aipfleet dispatch --issuer %s=DID, the DID `aipfleet keygen --did-of %s` prints) for the audience %s",
			f.url, f.issuerKey, f.issuer, f.issuer, f.issuerKey, f.audience)
	}
	return fmt.Sprintf("%s refused aipfleet dev's token (%s), which only the dispatcher of that aipfleet dev trusts: is --url that dispatcher? Otherwise give --token, or --tenant with --issuer-key",
		f.url, filepath.Join(f.devStateDir, devTokenFile))
}

func apiFailure(status int, raw []byte) error {
	var e dispatch.ErrorResponse
	if json.Unmarshal(raw, &e) == nil && e.Error != nil {
		return fmt.Errorf("HTTP %d: %s: %s", status, printable(e.Error.Code), printableLines(e.Error.Message))
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return fmt.Errorf("HTTP %d %s, with an empty body", status, http.StatusText(status))
	}
	if status == http.StatusBadRequest && bytes.Contains(raw, []byte(plainHTTPToTLS)) {
		// What a Go HTTPS server (the dispatcher's, the control plane's)
		// answers a plain HTTP request.
		return &plainHTTPError{fmt.Errorf("HTTP %d: %s", status, plainHTTPToTLS)}
	}
	return fmt.Errorf("HTTP %d: %s", status, printable(aip.TruncateUTF8(string(bytes.TrimSpace(raw)), 500)))
}

// plainHTTPToTLS is the body of net/http's answer to a plain HTTP request
// on a TLS listener.
const plainHTTPToTLS = "Client sent an HTTP request to an HTTPS server"

// plainHTTPError is a request with an http:// URL that a server speaking
// HTTPS refused: with net/http's 400 answer, or by resetting the
// connection before (or while) that answer arrived, which it does when the
// request is longer than the TLS record header it read (a long token
// suffices). Every client of the dispatcher and of the control plane
// reports both the same way.
type plainHTTPError struct{ err error }

func (e *plainHTTPError) Error() string {
	return e.err.Error() + ": the server speaks HTTPS (it was started with --tls-cert-file): write its URL with https://"
}
func (e *plainHTTPError) Unwrap() error { return e.err }

// speaksTLS reports whether err, the failure of a request to rawURL, is an
// http:// request reset by a server that speaks HTTPS: the connection was
// reset and rawURL's host completes a TLS handshake.
func speaksTLS(ctx context.Context, rawURL string, err error) bool {
	if !errors.Is(err, syscall.ECONNRESET) {
		return false
	}
	u, perr := url.Parse(rawURL)
	if perr != nil || u.Scheme != "http" {
		return false
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	// The handshake only asks whether the server speaks TLS: nothing is
	// sent over the connection, so its certificate need not be trusted.
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}
	conn, derr := d.DialContext(ctx, "tcp", addr)
	if derr != nil {
		return false
	}
	conn.Close()
	return true
}

// resetBody is a response body whose read errors become a *plainHTTPError
// when the server that reset the connection speaks HTTPS (speaksTLS).
type resetBody struct {
	io.ReadCloser
	ctx context.Context
	url string
}

func (b *resetBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && speaksTLS(b.ctx, b.url, err) {
		err = &plainHTTPError{err}
	}
	return n, err
}

// jsonSyntax says why raw is not one JSON value, and where (nil when it is).
func jsonSyntax(raw []byte) error {
	if json.Valid(raw) {
		return nil
	}
	// Unmarshal checks the syntax first, as Valid does, and says where it
	// fails.
	err := json.Unmarshal(raw, new(any))
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("%v, at byte %d", se, se.Offset)
	}
	return err
}

func compact(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
