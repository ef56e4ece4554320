// Package pgconnerr words pgx's errors about a PostgreSQL connection
// string, and about a connection that could not be made, for the operator
// who wrote the string: what is wrong, at which host and port, and what
// to check, never the string itself, which holds the password.
//
// hostsdk/pgruntime and registry/pgregistry word their errors with it.
package pgconnerr

import (
	"errors"
	"net"
	"regexp"
	"slices"
	"strconv"
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

// ConnectFailure is why a connection could not be made (err from pgx's
// connect, or from a pool's first acquire), to follow "cannot connect to
// the database": " at ADDRESS: REASON" for each address pgx tried, joined
// by ";" when they failed differently (pgx
// tries the same address twice with sslmode=prefer, and each address a
// host name resolves to), instead of pgx's "failed to connect to
// `user=u database=d`:" and one indented line per attempt. A name that
// does not resolve is " at HOST:PORT: host name HOST not found". An error
// that is not a *pgconn.ConnectError is ": " and its text.
func ConnectFailure(err error) string {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return ": " + err.Error()
	}
	inner := ce.Unwrap()
	if w, ok := inner.(interface{ Unwrap() error }); ok && strings.HasPrefix(inner.Error(), "hostname resolving error: ") {
		inner = w.Unwrap()
	}
	attempts := []error{inner}
	if j, ok := inner.(interface{ Unwrap() []error }); ok {
		attempts = j.Unwrap()
	}
	fallback := ce.Config.Host
	if !strings.HasPrefix(fallback, "/") {
		fallback = net.JoinHostPort(fallback, strconv.Itoa(int(ce.Config.Port)))
	}
	var out []string
	for _, a := range attempts {
		s := " at " + dialFailure(a, fallback)
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, ";")
}

// dialFailure words one of pgx's connect attempts as "ADDRESS: REASON":
// the server's message for an error of the server's (authentication, no
// such database), the network's for one of the network ("connection
// refused"), pgx's words otherwise. pgx's attempt errors read "ADDRESS
// (HOST): STEP: ERROR"; an error of another form (a name that does not
// resolve, a failed session setup) is about fallback, the configured
// host and port.
func dialFailure(err error, fallback string) string {
	text := err.Error()
	addr, rest := fallback, text
	if a, r, ok := strings.Cut(text, " ("); ok {
		if _, r, ok := strings.Cut(r, "): "); ok {
			addr, rest = a, r
		}
	}
	var pgErr *pgconn.PgError
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.As(err, &pgErr):
		rest = pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		rest = "host name " + dnsErr.Name + " not found"
	case errors.As(err, &opErr) && opErr.Err != nil:
		rest = strings.TrimPrefix(opErr.Err.Error(), "connect: ")
	default:
		rest = strings.TrimPrefix(rest, "dial error: ")
	}
	return addr + ": " + rest
}

// ConnectHint is what to check about a connection that could not be made,
// by what failed: the host name, the host and port and whether PostgreSQL
// listens there, the user and password, the database's name. url names
// where the URL is ("the URL in --database-url-file"). It never quotes
// the URL.
func ConnectHint(err error, url string) string {
	var pgErr *pgconn.PgError
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "28"):
		return "check the user and password in " + url + ", and that the server's pg_hba.conf lets that user connect from this machine"
	case errors.As(err, &pgErr) && pgErr.Code == "3D000":
		return "check the database name in " + url + ", or create that database"
	case errors.As(err, &pgErr):
		return "check " + url + " and the server's log"
	case errors.As(err, &dnsErr):
		return "check the host name in " + url + ", and that this machine resolves it"
	case errors.As(err, &opErr):
		return "check the host and port in " + url + ", and that PostgreSQL runs there and accepts connections from this machine (its listen_addresses and port, a firewall)"
	}
	return "check the host, port, user, password and database in " + url + ", and that PostgreSQL runs there"
}
