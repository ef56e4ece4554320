package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

func registryCommand() *command {
	return &command{
		name:      "registry",
		summary:   "install the PostgreSQL registry schema, apply a fleet file, show the registry's state",
		usage:     "migrate | apply -f FILE | status  --database-url-file FILE [flags]",
		envPrefix: "AIP_REGISTRY_",
		long: `Operator commands on the PostgreSQL registry, through the control pool
(the admin role of deploy/postgres/roles.sql, which owns schema
aip_registry):

  aipfleet registry migrate          install or upgrade the schema (idempotent;
                                     one transaction under an advisory lock)
  aipfleet registry apply -f FILE    apply a fleet file (docs/fleet-file.md) and
                                     print what it created, updated or left alone
  aipfleet registry status           schema version, catalog revision and a
                                     fleet summary

The database URL is read from --database-url-file, a file readable by its
owner only (chmod 600). apply installs a missing schema first, like
migrate. A fleet file is checked completely before anything is written; an
error names the entry, its line and the field. Applying the same file
again changes nothing. Replicas are created offline: each one's host
registers it.`,
		examples: []string{
			"aipfleet registry migrate --database-url-file admin-db.url",
			"aipfleet registry apply -f fleet.yaml --database-url-file admin-db.url",
			"AIP_REGISTRY_DATABASE_URL_FILE=admin-db.url aipfleet registry status",
			"aipfleet registry apply -f fleet.yaml --database-url-file admin-db.url --json | jq '.entries[] | select(.change != \"unchanged\")'",
		},
		run: runRegistry,
	}
}

func runRegistry(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	dbFile := fs.String("database-url-file", "", "file holding the PostgreSQL URL of the admin role (the control pool); mode 0600, at most 16 KiB")
	file := fs.String("file", "", "apply: the fleet file (YAML, docs/fleet-file.md), also -f FILE; - reads standard input")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	timeout := fs.Duration("timeout", time.Minute, "bound on the whole command")
	fs.NoEnv("file")
	args = shorthandFile(args)
	sub, err := fs.subcommand(args, e.stdout, "migrate", "apply", "status")
	if err != nil {
		return err
	}
	if err := fs.parse(args[1:], e.stdout); err != nil {
		return err
	}
	switch sub {
	case "migrate", "status":
		if *file != "" {
			return usagef("registry %s: --file is for apply", sub)
		}
	case "apply":
		if *file == "" && len(fs.args()) > 0 {
			return usagef("registry apply: the fleet file goes in -f, before any other argument: aipfleet registry apply -f %s [flags]", fs.args()[0])
		}
		if *file == "" {
			return usagef("registry apply: -f FILE is required (the fleet file to apply; docs/fleet-file.md)")
		}
	}
	if len(fs.args()) > 0 {
		return usagef("registry %s: unexpected argument %q (the fleet file goes in -f)", sub, fs.args()[0])
	}
	if *dbFile == "" {
		return usagef("registry %s: --database-url-file is required (a file holding the admin role's PostgreSQL URL)", sub)
	}
	if *timeout <= 0 {
		return usagef("registry %s: --timeout must be positive", sub)
	}
	var fleet *registry.FleetFile
	var raw []byte
	if sub == "apply" {
		var err error
		if raw, err = readFleetFile(*file); err != nil {
			return err
		}
		if fleet, err = registry.ParseFleetFile(raw); err != nil {
			return settingError(inFleetFile(err, "registry apply", *file, raw))
		}
	}
	dbURL, err := readDatabaseURL("registry "+sub, *dbFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	switch sub {
	case "migrate":
		err = registryMigrate(ctx, e, dbURL, *asJSON)
	case "apply":
		err = registryApply(ctx, e, dbURL, *file, raw, fleet, *asJSON, *timeout)
	default:
		err = registryStatus(ctx, e, dbURL, *asJSON)
	}
	return withConnectHint(err, *dbFile)
}

// withConnectHint adds to err, when it is a failure to connect to
// PostgreSQL (refused, no such host, authentication, no such database),
// that the URL is the one in file, the --database-url-file, and what of it
// to check: pgx's error names the host and user, not where they came from.
// A server that refused the connection for want of connections (SQLSTATE
// 53300: the role's or the database's CONNECTION LIMIT, or max_connections)
// got the URL right: the hint then says how many connections each command
// holds and which limits to raise.
func withConnectHint(err error, file string) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == sqlstateTooManyConnections {
		return fmt.Errorf("%w\n(PostgreSQL allows no more connections for the role or database of the URL in --database-url-file %s: "+
			"registry apply holds 3 at once (its apply lock's and one per pool), registry migrate and status 1, "+
			"aipfleet control-plane and dispatch up to their --max-connections; raise the role's or the database's "+
			"CONNECTION LIMIT (ALTER ROLE or ALTER DATABASE ... CONNECTION LIMIT) or the server's max_connections, or end the sessions that hold them)", err, file)
	}
	return fmt.Errorf("%w\n(the PostgreSQL URL is the one in --database-url-file %s: check that PostgreSQL runs at its host and port, and that its user, password and database are right)", err, file)
}

// sqlstateTooManyConnections is PostgreSQL's too_many_connections: a
// role's or database's CONNECTION LIMIT, or the server's max_connections,
// is reached.
const sqlstateTooManyConnections = "53300"

// shorthandFile spells -f FILE (and -f=FILE) as --file.
func shorthandFile(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case a == "-f":
			a = "--file"
		case strings.HasPrefix(a, "-f="):
			a = "--file=" + strings.TrimPrefix(a, "-f=")
		}
		out[i] = a
	}
	return out
}

func readFleetFile(name string) ([]byte, error) {
	if name == "-" {
		raw, err := io.ReadAll(io.LimitReader(os.Stdin, registry.MaxFleetFileBytes+1))
		if err != nil {
			return nil, fmt.Errorf("read the fleet file from standard input: %w", err)
		}
		return raw, nil
	}
	raw, err := aip.ReadPublicFile(name, registry.MaxFleetFileBytes)
	if err != nil {
		return nil, flagFileError("registry apply", "-f", err)
	}
	return raw, nil
}

// inFleetFile names the fleet file in the *registry.FleetFileError errors
// err holds, as the person gave it ("fleet file fleet.yaml: instances[0]
// ..."; "-" is standard input), and adds the entry's line in raw, the
// file's YAML, where they name the entry but not its line (registry.Apply
// does not know lines; ParseFleetFile's errors have them). An error about
// something else is returned after the file's name. Either way the error
// starts with command, as typed ("registry apply", "dev"), as the
// command's other errors do: every error about the content of a fleet
// file goes through here, and started with "fleet file" alone.
func inFleetFile(err error, command, name string, raw []byte) error {
	if err == nil {
		return nil
	}
	file := name
	if name == "-" {
		file = "from standard input"
	}
	found := false
	eachFleetFileError(err, func(fe *registry.FleetFileError) {
		found = true
		fe.File = file
		if fe.Line == 0 && fe.Section != "" {
			fe.Line = entryLine(raw, fe.Section, fe.Index)
		}
	})
	if !found {
		return fmt.Errorf("%s: %s: %w", command, name, err)
	}
	return fmt.Errorf("%s: %w", command, err)
}

// eachFleetFileError calls f with each *registry.FleetFileError in err's
// tree (registry.Apply joins two when disabling the file's types failed
// too), not looking inside them.
func eachFleetFileError(err error, f func(*registry.FleetFileError)) {
	switch e := err.(type) {
	case *registry.FleetFileError:
		f(e)
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			eachFleetFileError(inner, f)
		}
	case interface{ Unwrap() error }:
		eachFleetFileError(e.Unwrap(), f)
	}
}

// entryLine returns the line of entry i of a section of a fleet file's
// YAML, 0 when it cannot tell.
func entryLine(raw []byte, section string, i int) int {
	var doc yaml.Node
	if yaml.Unmarshal(raw, &doc) != nil || len(doc.Content) == 0 {
		return 0
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return 0
	}
	for k := 0; k+1 < len(root.Content); k += 2 {
		if root.Content[k].Value == section && root.Content[k+1].Kind == yaml.SequenceNode && i < len(root.Content[k+1].Content) {
			return root.Content[k+1].Content[i].Line
		}
	}
	return 0
}

// adminRoleHint is what to add to err, a failed migrate or apply, when
// PostgreSQL refused it a privilege (SQLSTATE 42501, insufficient_privilege): those commands write
// the schema and the catalog, which only the admin role may. It is "" for
// any other error.
func adminRoleHint(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return ""
	}
	return "; registry migrate and apply write the schema and the catalog, which only the admin role aip_registry_admin of deploy/postgres/roles.sql may: point --database-url-file at that role's URL (the dispatcher's and the control plane's roles cannot change them)"
}

func registryMigrate(ctx context.Context, e *env, dbURL string, asJSON bool) error {
	// One connection migrates, verifies and reads the revision back: a
	// database near max_connections, a role with a connection limit or a
	// pooler need allow no more.
	res, err := pgregistry.MigrateSchema(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("migrate the registry schema: %w%s", err, adminRoleHint(err))
	}
	changed := res.Applied > 0
	// Records an earlier build stored with an identifier no build since
	// takes are kept; the operator learns of them here, once per kind and
	// field, with what that does to them.
	for _, u := range res.Unnamable {
		fmt.Fprintf(e.stderr, "warning: %s whose %s holds an invisible formatting character (%d, stored by a build before the rule) are kept as stored, but %s: %s%s\n  fix: %s\n",
			u.Kind, u.Field, u.Count, u.Effect, strings.Join(u.Records, "; "), moreThan(u.Count, len(u.Records)), u.Fix)
	}
	if asJSON {
		unnamable := res.Unnamable
		if unnamable == nil {
			unnamable = []pgregistry.UnnamableRecords{}
		}
		return writeJSON(e.stdout, map[string]any{"schema_version": pgregistry.SchemaVersion, "catalog_revision": res.CatalogRevision, "changed": changed,
			"unnamable": unnamable})
	}
	if !changed {
		// Nothing changed, so there is nothing new to grant.
		fmt.Fprintf(e.stdout, "registry schema aip_registry is already at version %d (catalog revision %d); nothing changed\n", pgregistry.SchemaVersion, res.CatalogRevision)
		return nil
	}
	fmt.Fprintf(e.stdout, "registry schema aip_registry is at version %d (catalog revision %d)\n", pgregistry.SchemaVersion, res.CatalogRevision)
	fmt.Fprintln(e.stdout, "next: grant the restricted roles their tables (psql -f deploy/postgres/roles.sql), then apply a fleet file")
	return nil
}

// moreThan is "; and N more" when named of count records were named.
func moreThan(count, named int) string {
	if count > named {
		return fmt.Sprintf("; and %d more", count-named)
	}
	return ""
}

func registryApply(ctx context.Context, e *env, dbURL, name string, raw []byte, fleet *registry.FleetFile, asJSON bool, timeout time.Duration) error {
	// One apply at a time: another operator's apply of another file would
	// interleave with this one entry by entry.
	unlock, err := pgregistry.LockApply(ctx, dbURL, func() {
		fmt.Fprintf(e.stderr, "waiting for another registry apply to finish (Ctrl-C to give up)\n")
	})
	if err != nil {
		return fmt.Errorf("take the registry apply lock (check --database-url-file and that the database is reachable): %w", err)
	}
	defer unlock()
	reg, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: dbURL, ControlMaxConns: 1, DataMaxConns: 1})
	if err != nil {
		return fmt.Errorf("open the registry (control pool): %w%s", err, adminRoleHint(err))
	}
	defer reg.Close()
	before, err := reg.CatalogRevision(ctx)
	if err != nil {
		return err
	}
	rep, applyErr := registry.Apply(ctx, reg, fleet)
	applyErr = inFleetFile(applyErr, "registry apply", name, raw)
	// An apply interrupted (Ctrl-C, SIGTERM) or out of --timeout still
	// reports the revision it left, read on a context of its own.
	readCtx, cancelRead := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancelRead()
	after, err := reg.CatalogRevision(readCtx)
	if err != nil && applyErr == nil {
		return err
	}
	afterKnown := err == nil
	if asJSON {
		out := map[string]any{"file": name, "entries": rep.Entries, "catalog_revision_before": before, "catalog_revision": nil,
			"created": rep.Count(registry.Created), "updated": rep.Count(registry.Updated), "unchanged": rep.Count(registry.Unchanged)}
		if afterKnown {
			out["catalog_revision"] = after
		}
		if applyErr != nil {
			out["error"] = applyErr.Error()
		}
		if err := writeJSON(e.stdout, out); err != nil {
			return err
		}
	} else {
		printApplyReport(e.stdout, name, &rep, before, after, afterKnown)
	}
	if applyErr != nil {
		if hint := adminRoleHint(applyErr); hint != "" {
			return fmt.Errorf("%w%s", applyErr, hint)
		}
		// The report lists the entries applied before the failure: none
		// when the first one failed.
		applied := "the entries above were applied"
		if len(rep.Entries) == 0 {
			applied = "nothing was applied"
		}
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return fmt.Errorf("%w; --timeout %s ran out: %s, apply the file again to complete it (with a longer --timeout for a file this large)", applyErr, timeout, applied)
		case ctx.Err() != nil:
			return fmt.Errorf("%w; interrupted: %s, apply the file again to complete it", applyErr, applied)
		}
		return fmt.Errorf("%w; %s, fix the file and apply it again", applyErr, applied)
	}
	if rep.Count(registry.Created)+rep.Count(registry.Updated) > 0 {
		// Fresh statistics, so the services plan for the tables as they
		// are now (a first apply loads empty tables).
		if err := reg.Analyze(ctx); err != nil {
			fmt.Fprintf(e.stderr, "warning: %s was applied, but analyzing the registry's tables failed: %v (run ANALYZE on the registry database)\n", name, err)
		}
	}
	return nil
}

// printApplyReport prints what an apply did. afterKnown is false when the
// catalog revision after it could not be read.
func printApplyReport(w io.Writer, name string, rep *registry.ApplyReport, before, after uint64, afterKnown bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, en := range rep.Entries {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", en.Change, en.Section, en.ID)
	}
	tw.Flush()
	rev := fmt.Sprintf("catalog revision %d (unchanged)", after)
	switch {
	case !afterKnown:
		rev = fmt.Sprintf("catalog revision %d before; unknown after (the registry did not answer)", before)
	case after != before:
		rev = fmt.Sprintf("catalog revision %d -> %d", before, after)
	}
	fmt.Fprintf(w, "%s: %d created, %d updated, %d unchanged; %s\n", name,
		rep.Count(registry.Created), rep.Count(registry.Updated), rep.Count(registry.Unchanged), rev)
}

// registryStatusDoc is the --json form of registry status.
type registryStatusDoc struct {
	SchemaVersion      int                         `json:"schema_version"`
	BuildSchemaVersion int                         `json:"build_schema_version"`
	CatalogRevision    uint64                      `json:"catalog_revision"`
	Checks             []registry.ReadinessCheck   `json:"checks"`
	Fleet              registry.FleetStatusSummary `json:"fleet"`
}

func registryStatus(ctx context.Context, e *env, dbURL string, asJSON bool) error {
	reg, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL, DataMaxConns: 1})
	if err != nil {
		if errors.Is(err, pgregistry.ErrSchemaMismatch) {
			return fmt.Errorf("%w (this build needs schema version %d)", err, pgregistry.SchemaVersion)
		}
		return fmt.Errorf("open the registry: %w", err)
	}
	defer reg.Close()
	ready, err := reg.Readiness(ctx)
	if err != nil {
		return err
	}
	st, err := reg.Status(ctx)
	if err != nil {
		return err
	}
	doc := registryStatusDoc{SchemaVersion: ready.SchemaVersion, BuildSchemaVersion: pgregistry.SchemaVersion,
		CatalogRevision: ready.CatalogRevision, Checks: ready.Checks, Fleet: st}
	return reportRegistryStatus(e.stdout, doc, asJSON)
}

// reportRegistryStatus prints doc as text or JSON and then, in both forms,
// returns an error naming the failing checks, so the exit status says
// whether the registry is ready.
func reportRegistryStatus(w io.Writer, doc registryStatusDoc, asJSON bool) error {
	if asJSON {
		if err := writeJSON(w, doc); err != nil {
			return err
		}
	} else {
		printRegistryStatus(w, doc)
	}
	var failing []string
	for _, c := range doc.Checks {
		if !c.OK {
			failing = append(failing, c.Name)
		}
	}
	if len(failing) > 0 {
		return fmt.Errorf("registry check failing: %s (see the checks printed above)", strings.Join(failing, ", "))
	}
	return nil
}

func printRegistryStatus(w io.Writer, doc registryStatusDoc) {
	st := doc.Fleet
	fmt.Fprintf(w, "schema    aip_registry version %d (this build: %d)\n", doc.SchemaVersion, doc.BuildSchemaVersion)
	fmt.Fprintf(w, "catalog   revision %d: %s, %s, %s\n", st.CatalogRevision,
		plural(st.ConnectorTypes, "connector type"), plural(st.ActiveVersions, "active version"), plural(st.EnabledInstances, "enabled instance"))
	fmt.Fprintf(w, "replicas  %d live: %d ready, %d draining, %d with an expired lease; %s\n",
		st.LiveReplicas, st.ReadyReplicas, st.DrainingReplicas, st.ExpiredLeases, offlineText(&st))
	fmt.Fprintf(w, "capacity  %d ready, %s\n", st.ReadyCapacity, plural(st.ActiveAssignments, "active assignment"))
	for _, c := range doc.Checks {
		state := "ok"
		if !c.OK {
			state = "FAILING"
		}
		if c.Message != "" {
			state += ": " + c.Message
		}
		fmt.Fprintf(w, "check     %s %s\n", c.Name, state)
	}
}

// plural is n and thing, in the plural unless n is 1 ("1 replica", "3
// replicas"). thing is a word or phrase whose plural adds an s to its end.
func plural[N ~int | ~int64 | ~uint64](n N, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprint(n) + " " + thing + "s"
}

// countIs is a count of all of n things with its verb: "the replica is",
// "both replicas are", "all 3 replicas are".
func countIs(n int, thing string) string {
	switch n {
	case 1:
		return "the " + thing + " is"
	case 2:
		return "both " + thing + "s are"
	}
	return "all " + plural(n, thing) + " are"
}

// times is "once", "twice", "3 times".
func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return strconv.Itoa(n) + " times"
}
