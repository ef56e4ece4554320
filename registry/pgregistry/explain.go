package pgregistry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// QueryPlan is the plan PostgreSQL chooses for one of the registry's hot
// queries.
type QueryPlan struct {
	// Name names the query ("route selection", "tenant catalog view", ...).
	Name string
	// Plan is the EXPLAIN output in text form.
	Plan string
	// SeqScans lists the tables the plan reads sequentially.
	SeqScans []string
	// Indexes lists the indexes the plan uses.
	Indexes []string
}

// ExplainQueries explains the registry's hot queries for one tenant and
// capability at the registry's clock: route selection (the ranked
// candidates, the lock of the first free one, and the one-statement
// selection among a cached binding's replicas), the binding check, the tenant and internal
// catalog views, the tenant catalog page query, the route lookup, lease
// expiry's selection, the stranded-reservation selection and the lifecycle
// replica lock. With analyze the
// queries run (EXPLAIN ANALYZE) inside a transaction that is rolled back,
// so nothing changes. It is a diagnostic for operators and for the scale
// tests; it runs on the data pool.
func (r *Registry) ExplainQueries(ctx context.Context, tenantID, capabilityID string, analyze bool) ([]QueryPlan, error) {
	now := r.nowMS()
	action := "act_00000000000070008000000000000000"
	candidateArgs := []any{tenantID, capabilityID, now, "", false, "", "", action}
	queries := []struct {
		name string
		sql  string
		args []any
	}{
		{"route selection (candidates)", candidates, candidateArgs},
		{"route selection (take, FOR UPDATE SKIP LOCKED)", takeFree, []any{[]string{"crepl_a", "crepl_b"}, now}},
		{"route selection (cached binding)", "WITH " + takeBestChoice + " SELECT * FROM chosen",
			[]any{int64(0), action, "cinst_a", "cver_a", now, "", false, "", ""}},
		{"first valid binding", firstBinding, []any{tenantID, capabilityID}},
		{"route lookup", selectRoute, []any{action}},
		{"tenant catalog view", tenantView, []any{tenantID, "", ""}},
		{"tenant catalog page (SQL path)", tenantPage, []any{tenantID, "", "", "", "", 51, 50, r.limits.MaxPageBytes}},
		{"internal catalog view", internalView, []any{"", "", ""}},
		{"lease expiry selection", staleReplicas, []any{now, 500}},
		{"stranded reservation selection", strandedReplicas, []any{now, 500}},
		{"lifecycle replica lock", lockLifecycleReplicas, []any{[]string{"crepl_a", "crepl_b"}}},
	}
	var out []QueryPlan
	err := r.inTx(ctx, r.data, "explain queries", func(tx pgx.Tx) error {
		out = out[:0]
		opts := "COSTS true"
		if analyze {
			opts = "ANALYZE true, BUFFERS true"
		}
		for _, q := range queries {
			var doc []byte
			if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON, "+opts+") "+q.sql, q.args...).Scan(&doc); err != nil {
				return fmt.Errorf("explain %s: %w", q.name, err)
			}
			p := QueryPlan{Name: q.name}
			var plans []struct {
				Plan planNode `json:"Plan"`
			}
			if err := json.Unmarshal(doc, &plans); err != nil {
				return fmt.Errorf("decode the plan of %s: %w", q.name, err)
			}
			for _, pl := range plans {
				pl.Plan.walk(&p)
			}
			slices.Sort(p.SeqScans)
			p.SeqScans = slices.Compact(p.SeqScans)
			slices.Sort(p.Indexes)
			p.Indexes = slices.Compact(p.Indexes)
			rows, err := tx.Query(ctx, "EXPLAIN ("+opts+") "+q.sql, q.args...)
			if err != nil {
				return fmt.Errorf("explain %s: %w", q.name, err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return fmt.Errorf("explain %s: %w", q.name, err)
			}
			p.Plan = strings.Join(lines, "\n")
			out = append(out, p)
		}
		return errRollback
	})
	if err != nil && !errors.Is(err, errRollback) {
		return nil, err
	}
	return out, nil
}

// errRollback makes inTx roll back a transaction that did its work.
var errRollback = errors.New("pgregistry: rolled back on purpose")

type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}

func (n *planNode) walk(p *QueryPlan) {
	if n.NodeType == "Seq Scan" && n.RelationName != "" {
		p.SeqScans = append(p.SeqScans, n.RelationName)
	}
	if n.IndexName != "" {
		p.Indexes = append(p.Indexes, n.IndexName)
	}
	for i := range n.Plans {
		n.Plans[i].walk(p)
	}
}
