package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// TestStateKeyLimits: a namespace or key at its bound is stored, one byte
// more is refused with journal.ErrInvalid by every State method, on every
// journal alike (the embedded one took any length, PostgreSQL fails past
// about 2.7 KB with a storage error), and so are an empty key and a
// reserved namespace, as documented.
func TestStateKeyLimits(t *testing.T) {
	f := newFleet(t)
	type attempt struct {
		name      string
		namespace string
		key       string
		ok        bool
	}
	ns, key := strings.Repeat("n", hostsdk.MaxStateNamespaceBytes), strings.Repeat("k", hostsdk.MaxStateKeyBytes)
	attempts := []attempt{
		{"namespace and key at their bounds", ns, key, true},
		{"namespace one byte over", ns + "n", "k", false},
		{"key one byte over", "test", key + "k", false},
		{"empty key", "test", "", false},
		{"reserved namespace", hostsdk.ReservedStatePrefix + "x", "k", false},
	}
	errs := make(chan []error, 1)
	conn := &funcConnector{testConnector: newTestConnector(), handle: func(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
		var out []error
		for _, a := range attempts {
			_, perr := call.State().Put(ctx, a.namespace, a.key, 1, 0)
			_, gerr := call.State().Get(ctx, a.namespace, a.key)
			_, _, uerr := call.State().Update(ctx, a.namespace, a.key, func(cur json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`2`), nil })
			out = append(out, perr, gerr, uerr)
		}
		errs <- out
		return call.Complete(map[string]any{})
	}}
	_, target := f.start(t, conn)
	if _, err := f.d.Act(ctxT(t), target, action(capBlock, `{"message":"x"}`)); err != nil {
		t.Fatal(err)
	}
	got := <-errs
	for i, a := range attempts {
		for j, method := range []string{"Put", "Get", "Update"} {
			err := got[3*i+j]
			switch {
			case a.ok && err != nil:
				t.Errorf("%s: %s: %v", a.name, method, err)
			case !a.ok && !errors.Is(err, journal.ErrInvalid):
				t.Errorf("%s: %s: %v, want an error matching journal.ErrInvalid", a.name, method, err)
			}
		}
	}
}
