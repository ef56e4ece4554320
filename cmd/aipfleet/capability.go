package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

func capabilityCommand() *command {
	return &command{
		name:      "capability",
		summary:   "list the capabilities a tenant can call, or show one",
		usage:     "list|get [flags]",
		envPrefix: "AIP_CLIENT_",
		long: `Reads the tenant's catalog from the dispatcher (GET /aip/v1/capabilities,
docs/dispatch-api.md): the capabilities action send can call for the token's
tenant.

  aipfleet capability list                  every capability, one line each
  aipfleet capability get CAPABILITY_ID     one capability: its contract and schemas

list prints one line per capability, ordered by ID: its ID, the modes its
contract declares (sync, streaming: action send --mode; async), its side
effects, its risk, its stability and its name. --search TEXT keeps those
whose ID, name or description contains TEXT (ignoring case), --profile
those offered over that transport profile. It reads every page of the
catalog, and starts again from the first when the catalog changes between
two pages. get adds what a caller needs to send an action well: whether it
can be cancelled, its idempotency and retry contract, its data
sensitivity, its input and output schemas. The catalog holds contracts, not
connector versions or replicas: aipfleet fleet status --wide shows those.
--json prints the dispatcher's JSON: for list one document with every
page's capabilities ({"catalog_revision", "capabilities", "total"}), for
get the capability's definition as the dispatcher sent it.

The dispatcher and the token are chosen as for aipfleet action: --url
(by default aipfleet dev's dispatcher, found through --dev-state-dir) with
--ca-file for a private CA, and --token, --tenant with --issuer-key, or
the token aipfleet dev wrote in --dev-state-dir.`,
		examples: []string{
			`aipfleet capability list   # against aipfleet dev`,
			`aipfleet capability get echo.say`,
			`aipfleet capability list --search calendar --token "$TOKEN" --url https://dispatch.example.net:8443`,
			`aipfleet capability get echo.say --json | jq .capability.input_schema`,
		},
		run: runCapability,
	}
}

// catalogRestarts bounds how often capability list starts again from the
// first page after the catalog changed under it (dispatch.stale_cursor).
const catalogRestarts = 3

// capabilityFlags are the parsed flags of aipfleet capability.
type capabilityFlags struct {
	client          actionFlags // --url, the token, --json and --request-timeout
	search, profile string
}

func runCapability(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	cf := bindClientFlags(fs)
	search := fs.String("search", "", "list: keep the capabilities whose ID, name or description contains this text (ignoring case)")
	profile := fs.String("profile", "", "list: keep the capabilities offered over this transport profile")
	reqTimeout := fs.Duration("request-timeout", 30*time.Second, "bound on each HTTP request")
	jsonOut := fs.Bool("json", false, "print the dispatcher's JSON")
	fs.NoEnv("search")
	fs.NoEnv("profile")

	sub, err := fs.subcommand(args, e.stdout, "list", "get")
	if err != nil {
		return err
	}
	// Flags may come before or after get's capability ID.
	rest, err := fs.parseInterleaved(args[1:], e.stdout)
	if err != nil {
		return err
	}
	if err := clientFlagsNotEmpty(fs, "capability "+sub); err != nil {
		return err
	}
	f := &capabilityFlags{search: *search, profile: *profile,
		client: actionFlags{requestTimeout: *reqTimeout, jsonOut: *jsonOut, command: "capability " + sub}}
	cf.fill(&f.client)
	switch sub {
	case "list":
		if len(rest) > 0 {
			return usagef("capability list: unexpected argument %q; to show one capability: aipfleet capability get %s", rest[0], printable(rest[0]))
		}
		if err := fs.notEmpty("capability list", map[string]string{
			"search":  "give the text to look for, or leave --search out to list every capability",
			"profile": "give the profile, or leave --profile out to list every capability",
		}); err != nil {
			return err
		}
	case "get":
		if len(rest) != 1 {
			return usagef("capability get: give exactly one capability ID (aipfleet capability list shows them)")
		}
		if err := checkCapabilityID(rest[0]); err != nil {
			return usagef("capability get: %v", err)
		}
		for _, name := range []string{"search", "profile"} {
			if fs.given[name] > 0 {
				return usagef("capability get: --%s is for capability list", name)
			}
		}
	}
	if f.client.requestTimeout <= 0 {
		return usagef("capability %s: --request-timeout must be positive", sub)
	}
	if err := f.client.findURL(fs); err != nil {
		return err
	}
	bearer, err := f.client.bearer()
	if err != nil {
		return err
	}
	client, err := f.client.httpClient()
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	if sub == "get" {
		return f.get(ctx, client, bearer, rest[0], e)
	}
	return f.list(ctx, client, bearer, e)
}

// checkCapabilityID refuses an ID no catalog holds, as action send's
// capability_id: empty, too long, with control characters or surrounding
// spaces, or with an invisible formatting character.
func checkCapabilityID(id string) error {
	switch {
	case id == "":
		return errors.New("the capability ID is empty")
	case len(id) > dispatch.MaxCapabilityIDBytes:
		return fmt.Errorf("the capability ID is longer than %d bytes", dispatch.MaxCapabilityIDBytes)
	case !utf8.ValidString(id) || strings.TrimSpace(id) != id || strings.IndexFunc(id, unicode.IsControl) >= 0:
		return fmt.Errorf("capability ID %s must be text without control characters or surrounding spaces", printable(fmt.Sprintf("%q", id)))
	}
	if c, ok := registry.FormatCharacter(id); ok {
		return fmt.Errorf("capability ID %s holds the invisible formatting character U+%04X, which no capability ID may hold (it would print like a capability ID it is not): remove it",
			printable(fmt.Sprintf("%q", id)), c)
	}
	return nil
}

// catalog is the tenant's catalog as capability list reads it: every page
// of one catalog revision, the definitions as the dispatcher sent them.
type catalog struct {
	CatalogRevision uint64            `json:"catalog_revision"`
	Capabilities    []json.RawMessage `json:"capabilities"`
	Total           int               `json:"total"`
}

// capabilityPage is one page of GET /aip/v1/capabilities
// (dispatch.CapabilitiesResponse), its definitions kept as sent.
type capabilityPage struct {
	CatalogRevision uint64             `json:"catalog_revision"`
	Capabilities    *[]json.RawMessage `json:"capabilities"`
	NextCursor      string             `json:"next_cursor"`
	Total           int                `json:"total"`
}

// staleCursorError is the dispatcher's 409 dispatch.stale_cursor: the
// catalog changed since the cursor was issued.
type staleCursorError struct{ err error }

func (e *staleCursorError) Error() string { return e.err.Error() }
func (e *staleCursorError) Unwrap() error { return e.err }

// readAll reads every page of the catalog query q selects, following
// next_cursor. A read the catalog changed under (a 409 stale cursor, or a
// page of another revision) starts again from the first page, at most
// catalogRestarts times.
func (f *capabilityFlags) readAll(ctx context.Context, client *http.Client, bearer string, q url.Values) (catalog, error) {
	for attempt := 0; ; attempt++ {
		all, err := f.readOnce(ctx, client, bearer, q)
		var stale *staleCursorError
		if !errors.As(err, &stale) {
			return all, err
		}
		if attempt == catalogRestarts {
			return catalog{}, fmt.Errorf("the catalog changed while it was read, %s (it is the fleet's: any tenant's change counts): %w; run the command again, or narrow it with --search",
				times(catalogRestarts+1), stale.err)
		}
	}
}

// readOnce reads every page of one catalog revision; a staleCursorError
// says the catalog changed before its last page was read.
func (f *capabilityFlags) readOnce(ctx context.Context, client *http.Client, bearer string, q url.Values) (catalog, error) {
	var all catalog
	cursor := ""
	seen := map[string]bool{}
	for first := true; ; first = false {
		page, err := f.page(ctx, client, bearer, q, cursor)
		if err != nil {
			var stale *staleCursorError
			if errors.As(err, &stale) && first {
				// No cursor was sent: a 409 then is not about one.
				return all, stale.err
			}
			return all, err
		}
		if first {
			all.CatalogRevision, all.Total = page.CatalogRevision, page.Total
			all.Capabilities = []json.RawMessage{}
		} else if page.CatalogRevision != all.CatalogRevision {
			return all, &staleCursorError{fmt.Errorf("a page of catalog revision %d followed one of revision %d", page.CatalogRevision, all.CatalogRevision)}
		}
		all.Capabilities = append(all.Capabilities, *page.Capabilities...)
		if page.NextCursor == "" {
			return all, nil
		}
		if seen[page.NextCursor] || len(*page.Capabilities) == 0 {
			return all, fmt.Errorf("the dispatcher at %s answered a next_cursor that does not move on (%d capabilities read of %d): is --url the dispatcher?",
				f.client.url, len(all.Capabilities), all.Total)
		}
		seen[page.NextCursor] = true
		cursor = page.NextCursor
	}
}

// page reads one page of the catalog: the first, or the one cursor
// continues.
func (f *capabilityFlags) page(ctx context.Context, client *http.Client, bearer string, q url.Values, cursor string) (capabilityPage, error) {
	var out capabilityPage
	ctx, cancel := context.WithTimeout(ctx, f.client.requestTimeout)
	defer cancel()
	query := url.Values{}
	for k, v := range q {
		query[k] = v
	}
	if cursor != "" {
		query.Set("cursor", cursor)
	}
	path := dispatch.PathCapabilities
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	resp, err := f.client.do(ctx, client, bearer, http.MethodGet, path, nil)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 512<<20))
	if err != nil {
		return out, fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		err := f.client.failure(resp.StatusCode, raw)
		var e dispatch.ErrorResponse
		if resp.StatusCode == http.StatusConflict && json.Unmarshal(raw, &e) == nil && e.Error != nil && e.Error.Code == dispatch.CodeStaleCursor {
			return out, &staleCursorError{err}
		}
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Capabilities == nil {
		return out, fmt.Errorf("the answer from %s is not a page of capabilities (is --url the dispatcher?): %s", f.client.url, printable(aip.TruncateUTF8(string(bytes.TrimSpace(raw)), 200)))
	}
	return out, nil
}

// definitions decodes the catalog's definitions.
func definitions(raws []json.RawMessage) ([]registry.CapabilityDefinition, error) {
	defs := make([]registry.CapabilityDefinition, len(raws))
	for i, raw := range raws {
		if err := json.Unmarshal(raw, &defs[i]); err != nil || defs[i].Capability.ID == "" {
			return nil, fmt.Errorf("capability %d of the dispatcher's answer is not a capability definition: %s", i+1, printable(aip.TruncateUTF8(string(raw), 200)))
		}
	}
	return defs, nil
}

func (f *capabilityFlags) list(ctx context.Context, client *http.Client, bearer string, e *env) error {
	q := url.Values{}
	if f.search != "" {
		q.Set("q", f.search)
	}
	if f.profile != "" {
		q.Set("profile", f.profile)
	}
	all, err := f.readAll(ctx, client, bearer, q)
	if err != nil {
		return err
	}
	if f.client.jsonOut {
		// The definitions as sent: no HTML escaping added to them.
		enc := json.NewEncoder(e.stdout)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		return enc.Encode(all)
	}
	defs, err := definitions(all.Capabilities)
	if err != nil {
		return err
	}
	if len(defs) == 0 {
		switch {
		case f.search != "" || f.profile != "":
			fmt.Fprintf(e.stderr, "no capability of the token's tenant matches %s\n", f.filters())
		default:
			fmt.Fprintln(e.stderr, "the token's tenant has no capabilities: a fleet file binds capabilities to a tenant (docs/fleet-file.md)")
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPABILITY\tMODES\tSIDE EFFECTS\tRISK\tSTABILITY\tNAME")
	for _, d := range defs {
		c := d.Capability
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(c.ID), modes(c.Contract), sideEffects(c.Contract),
			orDash(string(c.Risk)), orDash(string(c.Stability)), printable(c.Name))
	}
	return tw.Flush()
}

// filters names the filters of a list, for its messages.
func (f *capabilityFlags) filters() string {
	var s []string
	if f.search != "" {
		s = append(s, "--search "+printable(fmt.Sprintf("%q", f.search)))
	}
	if f.profile != "" {
		s = append(s, "--profile "+printable(fmt.Sprintf("%q", f.profile)))
	}
	return strings.Join(s, " and ")
}

func (f *capabilityFlags) get(ctx context.Context, client *http.Client, bearer, id string, e *env) error {
	p, err := f.page(ctx, client, bearer, url.Values{"capability_id": {id}}, "")
	if err != nil {
		return err
	}
	if len(*p.Capabilities) == 0 {
		return fmt.Errorf("capability %s is not in the catalog of the token's tenant%s: `aipfleet capability list` lists those it can call%s",
			printable(id), f.similar(ctx, client, bearer, id), f.client.sameFlags())
	}
	raw := (*p.Capabilities)[0]
	if f.client.jsonOut {
		e.stdout.Write(bytes.TrimSpace(raw))
		fmt.Fprintln(e.stdout)
		return nil
	}
	defs, err := definitions(*p.Capabilities)
	if err != nil {
		return err
	}
	printCapability(e.stdout, defs[0])
	return nil
}

// similar suggests, after a get of id found nothing, the capabilities
// whose ID contains id ignoring case (an ID typed in another case, or
// without its prefix); "" when there are none or they could not be read.
func (f *capabilityFlags) similar(ctx context.Context, client *http.Client, bearer, id string) string {
	p, err := f.page(ctx, client, bearer, url.Values{"q": {id}}, "")
	if err != nil {
		return ""
	}
	defs, err := definitions(*p.Capabilities)
	if err != nil {
		return ""
	}
	var ids []string
	caseOnly := false
	for _, d := range defs {
		if strings.Contains(strings.ToLower(d.Capability.ID), strings.ToLower(id)) && len(ids) < 5 {
			ids = append(ids, printable(d.Capability.ID))
			caseOnly = caseOnly || strings.EqualFold(d.Capability.ID, id)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	note := " (did you mean "
	if caseOnly {
		note = " (IDs are case-sensitive: did you mean "
	}
	return note + strings.Join(ids, " or ") + "?)"
}

// printCapability prints a capability's definition for a caller about to
// send it an action.
func printCapability(w io.Writer, d registry.CapabilityDefinition) {
	c := d.Capability
	fmt.Fprintf(w, "capability %s: %s\n", printable(c.ID), printable(c.Name))
	if c.Description != "" {
		fmt.Fprintf(w, "%s\n", printableLines(c.Description))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(label, value string) { fmt.Fprintf(tw, "%s:\t%s\n", label, value) }
	line("kind", orDash(printable(string(c.Kind))))
	line("risk", orDash(printable(string(c.Risk))))
	line("stability", orDash(printable(string(c.Stability))))
	if c.RequiresHumanApproval != nil {
		line("human approval", map[bool]string{true: "required", false: "not required"}[*c.RequiresHumanApproval])
	}
	if k := c.Contract; k != nil {
		ex := k.Execution
		line("modes", modes(k))
		line("expected completion", orDash(printable(string(ex.ExpectedCompletion))))
		line("cancel", map[bool]string{true: "supported (aipfleet action cancel)", false: "not supported"}[ex.SupportsCancel])
		line("side effects", sideEffects(k))
		idem := "key " + orDash(printable(string(k.Idempotency.Requirement)))
		if k.Idempotency.Requirement != aip.IdempotencyUnsupported {
			// hostsdk passes the action ID when the caller sent no key.
			idem += " (without --idempotency-key, the action ID is the key)"
		}
		if k.Idempotency.CollisionBehavior != "" {
			idem += ", on a reused key " + printable(string(k.Idempotency.CollisionBehavior))
		}
		if k.Idempotency.KeyScope != "" {
			idem += ", scope " + printable(string(k.Idempotency.KeyScope))
		}
		line("idempotency", idem)
		line("retry safety", orDash(printable(string(ex.RetrySafety))))
		data := "sensitivity " + orDash(printable(string(k.Data.Sensitivity)))
		if k.Data.ContainsPII {
			data += ", contains PII"
		}
		if k.Data.RedactionRequired {
			data += ", redaction required"
		}
		line("data", data)
	} else {
		line("contract", "none declared")
	}
	if len(c.Bindings) > 0 {
		profiles := make([]string, len(c.Bindings))
		for i, b := range c.Bindings {
			profiles[i] = printable(b.Profile)
		}
		line("profiles", strings.Join(profiles, ", "))
	}
	line("contract digest", printable(d.ContractDigest))
	line("schema digest", printable(d.SchemaDigest))
	tw.Flush()
	for _, s := range []struct {
		label string
		raw   json.RawMessage
	}{{"input schema", c.InputSchema}, {"output schema", c.OutputSchema}} {
		if len(bytes.TrimSpace(s.raw)) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", s.label)
		var b bytes.Buffer
		if json.Indent(&b, s.raw, "", "  ") != nil {
			b.Reset()
			b.Write(s.raw)
		}
		for _, l := range strings.Split(b.String(), "\n") {
			fmt.Fprintf(w, "  %s\n", printable(l))
		}
	}
}

// modes lists the modes a contract declares: sync and streaming (action
// send --mode), async; "-" when it declares none or has no contract.
func modes(k *aip.CapabilityContract) string {
	if k == nil {
		return "-"
	}
	var m []string
	for _, s := range []struct {
		ok   bool
		name aip.ActionMode
	}{{k.Execution.SupportsSync, aip.ModeSync}, {k.Execution.SupportsStreaming, aip.ModeStreaming}, {k.Execution.SupportsAsync, "async"}} {
		if s.ok {
			m = append(m, string(s.name))
		}
	}
	return orDash(strings.Join(m, ","))
}

// sideEffects lists a contract's side effects; "-" when it declares none.
func sideEffects(k *aip.CapabilityContract) string {
	if k == nil {
		return "-"
	}
	s := make([]string, len(k.SideEffects))
	for i, e := range k.SideEffects {
		s[i] = printable(string(e))
	}
	return orDash(strings.Join(s, ","))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
