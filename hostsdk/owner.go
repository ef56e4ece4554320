package hostsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// ErrJournalOwner is returned (wrapped) by Run when the journal belongs to
// another tenant or connector type than the host's configuration names.
var ErrJournalOwner = errors.New("hostsdk: the journal belongs to another tenant or connector type")

// The journal's owner is kept in the host's reserved state namespace.
const (
	ownerNamespace = ReservedStatePrefix + "host"
	ownerKey       = "owner"
)

// journalOwner is whom a journal's actions and connector state belong to.
// Replica and instance IDs are not part of it: a replica may start again
// under a new replica ID on its journal (and recover its actions), and an
// instance may be re-created for the same tenant and connector.
type journalOwner struct {
	TenantID        string `json:"tenant_id"`
	ConnectorTypeID string `json:"connector_type_id"`
}

// claimJournal records the host's tenant and connector type in a journal
// that names none (a new one, or one written before the owner was kept)
// and refuses a journal that names others: its actions, receipts and
// connector state are another tenant's or another connector's, and serving
// them here would show them to the wrong tenant or feed one connector's
// records to another.
func (h *Host) claimJournal(ctx context.Context) error {
	want := journalOwner{TenantID: h.cfg.TenantID, ConnectorTypeID: h.cfg.ConnectorTypeID}
	for range 2 {
		v, err := h.journal.State(ctx, ownerNamespace, ownerKey)
		switch {
		case errors.Is(err, journal.ErrNotFound):
			if err := h.markOriginsKept(ctx); err != nil {
				return err
			}
			raw, err := json.Marshal(want)
			if err != nil {
				return err
			}
			_, err = h.journal.PutState(ctx, ownerNamespace, ownerKey, raw, 0)
			if errors.Is(err, journal.ErrConflict) {
				continue // another host claimed it meanwhile: compare with its claim
			}
			if err != nil {
				return fmt.Errorf("record the journal's owner: %w", err)
			}
			return nil
		case err != nil:
			return fmt.Errorf("read the journal's owner: %w", err)
		}
		var got journalOwner
		if err := json.Unmarshal(v.Value, &got); err != nil {
			return fmt.Errorf("%w: its owner record %s does not decode (%v); give this host a journal of its own", ErrJournalOwner, v.Value, err)
		}
		if got != want {
			return fmt.Errorf("%w: it holds the actions of tenant %q, connector type %q, and this host serves tenant %q, connector type %q; give each tenant's and connector's hosts their own journal (--state-dir, or another PostgreSQL namespace)",
				ErrJournalOwner, got.TenantID, got.ConnectorTypeID, want.TenantID, want.ConnectorTypeID)
		}
		return nil
	}
	return fmt.Errorf("%w: its owner record changed twice while this host read it: another host is opening the same journal; give each host its own journal (--state-dir, or another PostgreSQL namespace)", ErrJournalOwner)
}
