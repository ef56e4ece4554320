package pgruntime

import (
	"strconv"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// nastyIDs are action IDs that stress the split of the canonical receipt.
var nastyIDs = []string{
	"act_plain",
	`act_"quoted"`,
	`act_back\slash`,
	"act_ctl\x01\x1f\n\t\b\f\r",
	"act_ünïcødé_🚀_\u2028\u2029_\x7f",
	`act_,"prev_hash":"","seq":0,"status":"x"}`,
	`act_<html>&amp;`,
}

// TestReceiptPartsMatchReceiptHash: the hash the database assembles from
// the parts (as finishSQL does) is journal.ReceiptHash.
func TestReceiptPartsMatchReceiptHash(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	for i, id := range nastyIDs {
		for _, prev := range []string{"", aip.DigestBytes([]byte(id))} {
			r := journal.Receipt{
				Seq: uint64(i*1000 + 7), ID: aip.NewID(aip.PrefixReceipt), ActionID: id,
				Status: aip.StateOutcomeUnknown, ResultDigest: aip.DigestBytes([]byte("x")),
				PrevHash: prev, At: at,
			}
			head, mid, tail, err := receiptParts(r)
			if err != nil {
				t.Fatalf("receiptParts(%q): %v", id, err)
			}
			got := aip.DigestBytes([]byte(head + `"` + prev + `"` + mid + strconv.FormatUint(r.Seq, 10) + tail))
			want, err := journal.ReceiptHash(r)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("action %q: assembled hash %s, ReceiptHash %s\nparts %q %q %q", id, got, want, head, mid, tail)
			}
		}
	}
}
