package hostsdk_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/aip"
)

// TestStatusQueryCarriesTheReceipt: a status query of a finished action
// answers its result with the receipt the action's answer carried, as a
// resend of the action does, completed or failed.
func TestStatusQueryCarriesTheReceipt(t *testing.T) {
	f := newFleet(t)
	_, target := f.start(t, newTestConnector())
	ctx := ctxT(t)
	for _, c := range []struct {
		msg  string
		want aip.ResultStatus
	}{{"hi", aip.ResultCompleted}, {"fail", aip.ResultFailed}} {
		a := action(capEcho, `{"message":"`+c.msg+`"}`)
		resp, err := f.d.Act(ctx, target, a)
		if err != nil {
			t.Fatal(err)
		}
		res, err := resp.Result()
		if err != nil || res.Status != c.want || res.Receipt == nil {
			t.Fatalf("%s: answered %+v, %v", c.msg, res, err)
		}
		st, _, err := f.d.Status(ctx, target, a.ID, a.CapabilityID)
		if err != nil || st.Result == nil {
			t.Fatalf("%s: status %+v, %v", c.msg, st, err)
		}
		if st.Result.Receipt == nil || *st.Result.Receipt != *res.Receipt {
			t.Errorf("%s: status query's receipt %+v, want the action's %+v", c.msg, st.Result.Receipt, *res.Receipt)
		}
	}
}
