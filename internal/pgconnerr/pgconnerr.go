// Package pgconnerr words pgx's errors about a PostgreSQL connection
// string for the operator who wrote the string: what is wrong and what to
// do, never the string itself, which holds the password.
//
// hostsdk/pgruntime words its errors with it. (registry/pgregistry has its
// own copy of the same rule, in parseError.)
package pgconnerr

import (
	"errors"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// URLForm is the form of a PostgreSQL URL, for the errors that ask for one.
const URLForm = "postgres://USER:PASSWORD@HOST:PORT/DATABASE"

// URLHint is what to do about a connection string that does not parse:
// write it in URLForm, with the characters a URL reserves
// percent-encoded in the user and password (a / in the password makes pgx
// read what follows the user as a port).
const URLHint = "write it as " + URLForm + ", with any of : / @ ? # % in the user or password percent-encoded (%3A %2F %40 %3F %23 %25)"

// ParseReason is what pgx found wrong in a connection string it could not
// parse (err from pgx.ParseConfig, pgconn.ParseConfig or
// pgxpool.ParseConfig): "invalid port", "failed to parse as URL (invalid
// percent-encoded token in password)". pgx quotes the string in its
// error, with the password masked only as far as it recognises it (a
// keyword/value "password = x" keeps it in clear), so the string is left
// out, and so is any value pgx quotes in the reason ("(not shown)"). It
// is "" when err is not a *pgconn.ParseConfigError. Never wrap err itself
// in an error a person reads: its ConnString is the string in clear.
func ParseReason(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return ""
	}
	// The text is "cannot parse `STRING`: MSG" or "... MSG (CAUSE)". MSG
	// is pgx's own words; STRING and CAUSE may hold anything, "`: "
	// included, so CAUSE is cut off first by its known text.
	text := pe.Error()
	cause := ""
	if inner := pe.Unwrap(); inner != nil {
		if c := " (" + inner.Error() + ")"; strings.HasSuffix(text, c) {
			text, cause = strings.TrimSuffix(text, c), c
		}
	}
	i := strings.LastIndex(text, "`: ")
	if i < 0 || !strings.HasPrefix(text, "cannot parse `") {
		return "it is not a valid PostgreSQL connection string"
	}
	return quoted.ReplaceAllString(text[i+len("`: "):]+cause, `"(not shown)"`)
}

// quoted matches a double-quoted value in a pgx parse error's reason.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
