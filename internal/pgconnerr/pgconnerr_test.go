package pgconnerr_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/internal/pgconnerr"
)

// TestParseReason: the reason is pgx's words after the quoted string,
// with the values pgx quotes not shown, whatever the string holds.
func TestParseReason(t *testing.T) {
	for _, c := range []struct{ conn, want string }{
		{"postgres://u:pw@h:x/db", "invalid port"},
		{"host=h password = s3cret port=x", "invalid port"},
		// The string holds what ends pgx's quote: it is still cut off.
		{"postgres://u:pw@h/db?application_name=a%60%3A%20b&connect_timeout=s3cret", `invalid connect_timeout (strconv.ParseInt: parsing "(not shown)": invalid syntax)`},
		{"host=h password=`:s3cret connect_timeout=zz", `invalid connect_timeout (strconv.ParseInt: parsing "(not shown)": invalid syntax)`},
		{"s3cret", "failed to parse as keyword/value (invalid keyword/value)"},
	} {
		_, err := pgconn.ParseConfig(c.conn)
		if err == nil {
			t.Fatalf("%q parses", c.conn)
		}
		if got := pgconnerr.ParseReason(err); got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("ParseReason of %q = %q, want %q", c.conn, got, c.want)
		}
	}
	if got := pgconnerr.ParseReason(errors.New("other")); got != "" {
		t.Errorf("ParseReason of another error = %q, want \"\"", got)
	}
}

// TestConnectFailureOfAnotherError: an error that is not pgx's failure to
// connect is quoted as it is, with the hint that names every part of the
// URL. (hostsdk/pgruntime's tests cover pgx's errors, on a real server.)
func TestConnectFailureOfAnotherError(t *testing.T) {
	err := errors.New("context canceled")
	if got, want := pgconnerr.ConnectFailure(err), ": context canceled"; got != want {
		t.Errorf("ConnectFailure = %q, want %q", got, want)
	}
	if got, want := pgconnerr.ConnectHint(err, "the URL"), "check the host, port, user, password and database in the URL, and that PostgreSQL runs there"; got != want {
		t.Errorf("ConnectHint = %q, want %q", got, want)
	}
}
