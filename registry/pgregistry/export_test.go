package pgregistry

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file lets the external upgrade tests act as an older build: one
// whose last embedded migration is version, with this build's code.

// MigrateBuild is Migrate as the build of schema version did it.
func MigrateBuild(ctx context.Context, url string, version int) error {
	ms, err := embeddedMigrations()
	if err != nil {
		return err
	}
	if version < 1 || version > len(ms) {
		return fmt.Errorf("MigrateBuild: no schema version %d (this build has 1..%d)", version, len(ms))
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return applyMigrations(ctx, conn, ms[:version], nowMillisFunc(nil))
}

// OpenBuild opens a registry as the build of schema version did: Open
// when cfg.ControlURL is set, OpenDataPlane otherwise, verifying that the
// database holds exactly the first version migrations.
func OpenBuild(ctx context.Context, cfg Config, version int) (*Registry, error) {
	if cfg.ControlURL != "" {
		if err := MigrateBuild(ctx, cfg.ControlURL, version); err != nil {
			return nil, err
		}
	}
	if cfg.DataURL == "" {
		cfg.DataURL = cfg.ControlURL
	}
	control := cfg.ControlURL
	cfg.ControlURL = ""
	r, err := newRegistry(cfg)
	if err != nil {
		return nil, err
	}
	r.migrations = r.migrations[:version]
	if version < 14 {
		// Before migration 0014 events were stored and read as jsonb only
		// (the NULLs of the other rows typed so).
		for _, q := range []struct {
			stmt     *string
			old, new string
		}{
			{&r.eventsByID, eventDoc + " AS event", "event"},
			{&r.eventsByID, "'', NULL, received_at_ms", "'', NULL::jsonb, received_at_ms"},
			{&r.eventPage, eventDoc + " AS event", "event"},
			{&r.eventPage, "'', NULL, 0", "'', NULL::jsonb, 0"},
			{&r.insertEvents, "event, event_text,", "event,"},
			{&r.insertEvents, "n.ev::jsonb, n.ev,", "n.ev::jsonb,"},
		} {
			if !strings.Contains(*q.stmt, q.old) {
				return nil, fmt.Errorf("OpenBuild(%d): %s is no longer in %s", version, q.old, *q.stmt)
			}
			*q.stmt = strings.Replace(*q.stmt, q.old, q.new, 1)
		}
	}
	switch {
	case version < 9:
		// Before migration 0009 there were no pruned events to read.
		r.eventsByID = `SELECT ` + eventColumns + `, NULL::text, NULL::bytea FROM aip_registry.events WHERE tenant_id = $1 AND event_id = ANY($2::text[])`
	case version < 12:
		// Before migration 0012 pruned events kept no digest.
		const digest = "received_at_ms, event_id, digest"
		if !strings.Contains(r.eventsByID, digest) {
			return nil, fmt.Errorf("OpenBuild(%d): %s is no longer in %s", version, digest, r.eventsByID)
		}
		r.eventsByID = strings.Replace(r.eventsByID, digest, "received_at_ms, event_id, NULL::bytea", 1)
	}
	if control != "" {
		if r.control, err = newPool(ctx, "control", databaseURL, control, r.controlMax(cfg), r.acquireTimeout); err != nil {
			return nil, err
		}
	}
	if r.data, err = newPool(ctx, "data", databaseURL, cfg.DataURL, r.dataMax(cfg), r.acquireTimeout); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.VerifySchema(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// RouteStatementsOfBuild are this build's read of a route and its update
// when a Resolve returns a held route again, as the build of schema
// version (7 to 13) sent them: as this build for 13, 12 and 11 (migrations
// 0012 to 0014 changed no route), for 10 and older without the stripes of migration 0011, for 7,
// 8 and 9 without the claim columns of migration 0010 and, for 7, without
// the hand-out columns of migration 0008. The update takes the action ID
// and the time.
func RouteStatementsOfBuild(version int) (read, again string) {
	if version >= 11 && version <= 13 {
		return selectRoute, markResolvedAgain
	}
	cut := func(sql, part string) string {
		if !strings.Contains(sql, part) {
			panic(fmt.Sprintf("RouteStatementsOfBuild(%d): %s is no longer in %s", version, part, sql))
		}
		return strings.Replace(sql, part, "", 1)
	}
	read, again = cut(selectRoute, ", scope_stripes"), markResolvedAgain
	switch version {
	case 10:
		return read, again
	case 8, 9:
	case 7:
		read, again = cut(read, ", hand_out, reserved_hand_out"), cut(again, ", hand_out = hand_out + 1")
	default:
		panic(fmt.Sprintf("RouteStatementsOfBuild(%d): only the builds of schema 7 to 13", version))
	}
	return read, cut(again, ",\n\t\thand_out_claim = $3::text, claim_hand_out = hand_out + 1")
}

// LifecycleWriteOfBuild is this build's write of the replicas a lifecycle
// call changed as the build of schema version 12 sent it: without the
// offline reason of migration 0013. It takes the replicas' IDs, statuses,
// leases, capacities, health revisions, request IDs and digests as arrays,
// then the time.
func LifecycleWriteOfBuild(version int) string {
	if version != 12 {
		panic(fmt.Sprintf("LifecycleWriteOfBuild(%d): only the build of schema 12", version))
	}
	sql := writeLifecycleReplicas
	for _, part := range []string{", offline_reason = u.offline_reason, offline_at_ms = u.offline_at", ", $9::text[], $10::bigint[]", ", offline_reason, offline_at"} {
		if !strings.Contains(sql, part) {
			panic(fmt.Sprintf("LifecycleWriteOfBuild(%d): %q is no longer in %s", version, part, sql))
		}
		sql = strings.Replace(sql, part, "", 1)
	}
	return sql
}

// NewDataPool is the data pool a registry with cfg opens on cfg.DataURL,
// for tests of the pool's own settings.
func NewDataPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	r, err := newRegistry(cfg)
	if err != nil {
		return nil, err
	}
	return newPool(ctx, "data", databaseURL, cfg.DataURL, r.dataMax(cfg), r.acquireTimeout)
}

// PoolSetting returns what a session of the registry's pool ("control"
// or "data") shows for the setting name.
func (r *Registry) PoolSetting(ctx context.Context, pool, name string) (string, error) {
	p := r.data
	if pool == "control" {
		p = r.control
	}
	var v string
	err := p.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}

// ConnectApplyLock opens the session LockApply takes its lock on.
func ConnectApplyLock(ctx context.Context, controlURL string) (*pgx.Conn, error) {
	return connectApplyLock(ctx, controlURL)
}

// ServiceNeeds returns what s's role must hold: table to privileges in
// roles.sql's notation, and function signatures.
func ServiceNeeds(s Service) (tables map[string]string, functions []string) {
	tables = map[string]string{}
	for _, g := range serviceNeeds[s].tables {
		tables[g.table] = g.privileges
	}
	return tables, serviceNeeds[s].functions
}
