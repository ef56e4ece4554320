package hostsdk_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestJournalBelongsToOneTenantAndConnector: the first host to open a
// journal records its tenant and connector type there; a host of another
// tenant or another connector type is refused the journal (its actions and
// connector state are not theirs) with ErrJournalOwner saying what to do,
// and a host of the same ones — another replica ID included — starts on it.
func TestJournalBelongsToOneTenantAndConnector(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	owner := f.cfg
	h, target := f.start(t, conn)
	a := action(capEcho, `{"message":"kept"}`)
	resp, _ := f.d.Act(ctxT(t), target, a)
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("action: %+v %v", res, err)
	}
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		edit func(*hostsdk.Config)
		want string
	}{
		{"another tenant", func(c *hostsdk.Config) { c.TenantID = "tenant-other" }, `this host serves tenant "tenant-other"`},
		{"another connector type", func(c *hostsdk.Config) { c.ConnectorTypeID = aip.NewID(aip.PrefixType) }, "connector type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.cfg = owner
			tc.edit(&f.cfg)
			before := len(ops(f.cp))
			err := startErr(t, f, conn)
			if !errors.Is(err, hostsdk.ErrJournalOwner) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), `tenant "`+owner.TenantID+`"`) || !strings.Contains(err.Error(), "their own journal") {
				t.Fatalf("Start on another tenant's or connector's journal: %v; want ErrJournalOwner naming both owners and the fix", err)
			}
			if got := ops(f.cp); len(got) != before {
				t.Errorf("the refused host reached the control plane: %v", got[before:])
			}
		})
	}

	// The owner's hosts keep the journal, under a new replica ID too, and
	// find its actions.
	f.cfg = hostsdktest.HostConfig(t, f.cp, f.d, nil)
	f.cfg.ConnectorTypeID, f.cfg.TenantID, f.cfg.Journal = owner.ConnectorTypeID, owner.TenantID, owner.Journal
	_, target = f.start(t, conn)
	resp, _ = f.d.Act(ctxT(t), target, a)
	var out map[string]any
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted || json.Unmarshal(res.Output, &out) != nil {
		t.Fatalf("the same action on the owner's new replica: %+v %v", res, err)
	}
	if n := conn.runCount(a.ID); n != 1 {
		t.Errorf("the action ran %d times", n)
	}
}
