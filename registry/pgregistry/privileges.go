package pgregistry

import (
	"context"
	"fmt"
	"strings"

	"github.com/aipfleet/aipfleet/registry"
)

// Service names what a data pool serves (Config.Service), and so the
// privileges its role needs: those deploy/postgres/roles.sql grants that
// service's role.
type Service int

const (
	// AnyService checks no privileges: tools, tests and the registry
	// commands, whose role may be any.
	AnyService Service = iota
	// Dispatcher is the data plane (aipfleet dispatch): catalog reads,
	// routing, reservations, settlement and the event log, the privileges
	// of role aip_registry_data.
	Dispatcher
	// LifecycleService is the lifecycle service (aipfleet control-plane):
	// lifecycle commands, lease maintenance, fleet views and the event
	// retention, the privileges of role aip_registry_lifecycle.
	LifecycleService
)

// role is the roles.sql role that has exactly what s needs.
func (s Service) role() string {
	switch s {
	case Dispatcher:
		return "aip_registry_data"
	case LifecycleService:
		return "aip_registry_lifecycle"
	}
	return ""
}

func (s Service) String() string {
	switch s {
	case Dispatcher:
		return "the dispatcher"
	case LifecycleService:
		return "the lifecycle service (control plane)"
	case AnyService:
		return "any service"
	}
	return fmt.Sprintf("pgregistry.Service(%d)", int(s))
}

// tableGrant is what a service needs on one table, written as roles.sql's
// table of grants writes it: "SELECT, INSERT", or "SELECT (a, b), DELETE"
// for reading some columns only.
type tableGrant struct{ table, privileges string }

// serviceNeeds is, per service, what its role must hold: table privileges
// (in roles.sql's notation) and the functions it executes. They are
// exactly roles.sql's grants (TestServiceNeedsAreRolesSQLGrants), listed
// with the tables that tell one service from another first, since an
// error names the first few missing.
var serviceNeeds = map[Service]struct {
	tables    []tableGrant
	functions []string // signatures, to_regprocedure's notation
}{
	Dispatcher: {
		tables: []tableGrant{
			{"route_assignments", "SELECT, INSERT, UPDATE"},
			{"route_history", "SELECT, INSERT"},
			{"admission_counters", "SELECT, INSERT, UPDATE"},
			{"events", "SELECT, INSERT"},
			{"event_log_heads", "SELECT, INSERT, UPDATE"},
			{"connector_replicas", "SELECT, INSERT, UPDATE"},
			{"capability_bindings", "SELECT"},
			{"admission_policies", "SELECT"},
			{"pruned_events", "SELECT"},
			{"schema_migrations", "SELECT"},
			{"catalog_revision", "SELECT"},
			{"connector_types", "SELECT"},
			{"connector_versions", "SELECT"},
			{"capability_definitions", "SELECT"},
			{"version_capabilities", "SELECT"},
			{"version_profiles", "SELECT"},
			{"connector_instances", "SELECT"},
		},
		functions: []string{
			"scope_full(integer)",
			"scopes_full(text)",
			"replica_taken()",
			"event_replay_digest(text,text,jsonb)",
			"event_json_normal(jsonb)",
		},
	},
	LifecycleService: {
		tables: []tableGrant{
			{"control_replay", "SELECT, INSERT, UPDATE, DELETE"},
			{"events", "SELECT (tenant_id, sequence, received_at_ms), DELETE"},
			{"pruned_events", "SELECT (tenant_id, event_id, received_at_ms), DELETE"},
			{"connector_replicas", "SELECT, UPDATE"},
			{"route_assignments", "SELECT, UPDATE"},
			{"admission_counters", "SELECT, UPDATE"},
			{"schema_migrations", "SELECT"},
			{"catalog_revision", "SELECT"},
			{"connector_types", "SELECT"},
			{"connector_versions", "SELECT"},
			{"connector_instances", "SELECT"},
		},
	},
}

// privilegeCheck is one privilege to check: on a table (column empty), a
// column of it, or a function (privilege EXECUTE).
type privilegeCheck struct {
	kind              string // "table", "column", "function"
	object            string // unqualified table name or function signature
	column, privilege string
}

// checks expands what s needs into one check per privilege (and per
// column of a column grant): has_table_privilege is true when any one of
// several privileges it is asked about is held.
func (s Service) checks() []privilegeCheck {
	needs := serviceNeeds[s]
	var out []privilegeCheck
	for _, g := range needs.tables {
		for _, p := range splitGrant(g.privileges) {
			name, cols, _ := strings.Cut(p, " (")
			if cols == "" {
				out = append(out, privilegeCheck{kind: "table", object: g.table, privilege: name})
				continue
			}
			for _, c := range strings.Split(strings.TrimSuffix(cols, ")"), ",") {
				out = append(out, privilegeCheck{kind: "column", object: g.table, column: strings.TrimSpace(c), privilege: name})
			}
		}
	}
	for _, f := range needs.functions {
		out = append(out, privilegeCheck{kind: "function", object: f, privilege: "EXECUTE"})
	}
	return out
}

// splitGrant splits roles.sql's "SELECT (a, b), DELETE" at the commas
// outside parentheses.
func splitGrant(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if last := strings.TrimSpace(s[start:]); last != "" {
		out = append(out, last)
	}
	return out
}

// checkPrivileges is one catalog query: for each check, whether the
// session's role holds the privilege (directly or through a role it
// inherits). An object that is missing counts as not held.
const checkPrivileges = `
SELECT current_user::text,
       coalesce(array_agg(g.i ORDER BY g.i) FILTER (WHERE NOT coalesce(CASE g.kind
           WHEN 'table' THEN has_table_privilege(to_regclass('aip_registry.' || quote_ident(g.object))::oid, g.privilege)
           WHEN 'column' THEN has_column_privilege(to_regclass('aip_registry.' || quote_ident(g.object))::oid, g.col, g.privilege)
           ELSE has_function_privilege(to_regprocedure('aip_registry.' || g.object)::oid, g.privilege)
       END, false)), '{}')
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS g(kind, object, col, privilege, i)`

// maxNamed bounds the tables and functions a RoleError names.
const maxNamed = 4

// RoleError is returned when the data pool's role lacks privileges the
// service it serves needs (Config.Service): the wrong role's URL (the
// dispatcher's given to the control plane, or the other way round), or
// roles.sql not run again after a migration.
type RoleError struct {
	Role    string  // the session's role, current_user
	Service Service // what the pool serves
	// Missing lists the privileges the role lacks, one entry per table
	// or function: "SELECT, INSERT, UPDATE, DELETE on
	// aip_registry.control_replay", "EXECUTE on
	// aip_registry.scope_full(integer)".
	Missing []string
}

func (e *RoleError) Error() string {
	named := e.Missing[:min(len(e.Missing), maxNamed)]
	more := ""
	if n := len(e.Missing) - len(named); n > 0 {
		more = fmt.Sprintf(" (and %d more)", n)
	}
	want := e.Service.role()
	var fix string
	switch e.Role {
	case want:
		fix = fmt.Sprintf("Run deploy/postgres/roles.sql again as a superuser: it grants %s these (run it after every registry migrate)", want)
	case Dispatcher.role(), LifecycleService.role():
		fix = fmt.Sprintf("%s is another service's role: use the URL of role %s (deploy/postgres/roles.sql)", e.Role, want)
	default:
		fix = fmt.Sprintf("Use the URL of role %s of deploy/postgres/roles.sql, or grant %s what roles.sql grants %s", want, e.Role, want)
	}
	return fmt.Sprintf("pgregistry: role %s cannot serve %s: it lacks %s%s. %s",
		e.Role, e.Service, strings.Join(named, "; "), more, fix)
}

// CheckPrivileges checks, with one catalog query on the data pool, that
// the pool's role holds every privilege s needs (those roles.sql grants
// s's role); a role with more, such as the schema's owner or a
// superuser, passes. It returns a *RoleError naming the role, what it
// lacks and what to do. AnyService checks nothing. Open and OpenDataPlane
// call it for Config.Service.
func (r *Registry) CheckPrivileges(ctx context.Context, s Service) error {
	if s == AnyService {
		return nil
	}
	if _, ok := serviceNeeds[s]; !ok {
		return fmt.Errorf("%w: pgregistry: unknown %s", registry.ErrInvalid, s)
	}
	checks := s.checks()
	kinds, objects, cols, privs := make([]string, len(checks)), make([]string, len(checks)), make([]string, len(checks)), make([]string, len(checks))
	for i, c := range checks {
		kinds[i], objects[i], cols[i], privs[i] = c.kind, c.object, c.column, c.privilege
	}
	conn, err := r.acquire(ctx, r.data, "check privileges")
	if err != nil {
		return err
	}
	defer conn.Release()
	var role string
	var missing []int64
	if err := conn.QueryRow(ctx, checkPrivileges, kinds, objects, cols, privs).Scan(&role, &missing); err != nil {
		return storageErr("check privileges", err)
	}
	if len(missing) == 0 {
		return nil
	}
	// One entry per table or function, in the order of the needs:
	// "SELECT (tenant_id, sequence), DELETE on aip_registry.events".
	var order []string
	lacks := map[string][]string{}
	for _, i := range missing {
		c := checks[i-1]
		if _, seen := lacks[c.object]; !seen {
			order = append(order, c.object)
		}
		p := c.privilege
		if c.column != "" {
			p += " (" + c.column + ")"
		}
		lacks[c.object] = append(lacks[c.object], p)
	}
	e := &RoleError{Role: role, Service: s}
	for _, obj := range order {
		e.Missing = append(e.Missing, strings.Join(mergeColumns(lacks[obj]), ", ")+" on aip_registry."+obj)
	}
	return e
}

// mergeColumns joins the column privileges of one kind into one:
// "SELECT (a)", "SELECT (b)" become "SELECT (a, b)".
func mergeColumns(privs []string) []string {
	var out []string
	at := map[string]int{}
	for _, p := range privs {
		name, col, ok := strings.Cut(p, " (")
		if !ok {
			out = append(out, p)
			continue
		}
		col = strings.TrimSuffix(col, ")")
		if j, seen := at[name]; seen {
			out[j] = strings.TrimSuffix(out[j], ")") + ", " + col + ")"
			continue
		}
		at[name] = len(out)
		out = append(out, p)
	}
	return out
}
