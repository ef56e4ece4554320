package hostrun

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// The log formats of the fleet's programs (--log-format): LogJSON, one JSON
// object per line (slog's JSON handler), the default, for a collector;
// LogText, one readable line per event, for a terminal or a supervisor
// that stores text (journald).
const (
	LogJSON = "json"
	LogText = "text"
)

// LogFormatWant is what --log-format accepts, as its errors say it.
const LogFormatWant = "want json or text"

// LogFormatUsage is the help of a --log-format flag whose default is json.
const LogFormatUsage = "json (default: one JSON object per line) or text (one readable line per event)"

// CheckLogFormat returns nil for an accepted --log-format value (json or
// text) and an error saying what is accepted for any other.
func CheckLogFormat(v string) error {
	if v != LogJSON && v != LogText {
		return errors.New(LogFormatWant)
	}
	return nil
}

// LogLevelWant is what --log-level accepts, as its errors say it.
const LogLevelWant = "want debug, info, warn or error"

// ParseLogLevel parses a --log-level value; an error says what is
// accepted.
func ParseLogLevel(v string) (slog.Level, error) {
	var l slog.Level
	if l.UnmarshalText([]byte(v)) != nil {
		return 0, errors.New(LogLevelWant)
	}
	return l, nil
}

// CheckLogLevel is ParseLogLevel as a hostsdk.Setting's Check.
func CheckLogLevel(v string) error {
	_, err := ParseLogLevel(v)
	return err
}

// LogFormatSetting is the --log-format setting read from the variable env,
// for a program whose settings are read with hostsdk.BindSettings
// (aip-host, aip-sidecar): a value other than json or text is a
// *hostsdk.SettingError that names the flag, the variable and the accepted
// values.
func LogFormatSetting(env string) hostsdk.Setting {
	return hostsdk.Setting{Flag: "log-format", Env: env, Usage: LogFormatUsage, Check: CheckLogFormat}
}

// NewLogger returns the logger a program writes to w in format (json, or
// "" for the default; text) at level. A format CheckLogFormat refuses is
// taken as json: the caller checked it when it read the setting.
func NewLogger(w io.Writer, format string, level slog.Leveler) *slog.Logger {
	if format == LogText {
		return slog.New(NewTextHandler(w, level))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// NewTextHandler returns a slog.Handler that writes one readable line per
// event to w, as aipfleet dev's text log does:
//
//	2026-12-03T16:58:14.123Z INFO  replica ready replica_id=crepl_1 in_flight=0
//
// the time (UTC, milliseconds), the level padded to five columns, the
// message, then each attribute as key=value (a group's as group.key),
// the value quoted when it holds a space, a tab, a quote or an equals
// sign, and a newline in any value or the message escaped, so that an
// event is always one line. Lines are written whole, one Write each.
func NewTextHandler(w io.Writer, level slog.Leveler) slog.Handler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &textHandler{out: &lockedWriter{w: w}, level: level}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) write(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(b)
}

type textHandler struct {
	out   *lockedWriter
	level slog.Leveler
	attrs [][2]string
	group string
}

func (h *textHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h *textHandler) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	t := r.Time
	if t.IsZero() {
		t = time.Now()
	}
	b.WriteString(t.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteByte(' ')
	level := r.Level.String()
	b.WriteString(level)
	for i := len(level); i < 5; i++ {
		b.WriteByte(' ')
	}
	b.WriteByte(' ')
	b.WriteString(oneLine(r.Message))
	attrs := slices.Clone(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		attrs = appendTextAttr(attrs, h.group, a)
		return true
	})
	for _, a := range attrs {
		b.WriteByte(' ')
		b.WriteString(a[0])
		b.WriteByte('=')
		v := a[1]
		if v == "" || strings.ContainsAny(v, " \t\"=\n\r") {
			v = strconv.Quote(v)
		}
		b.WriteString(v)
	}
	b.WriteByte('\n')
	h.out.write(b.Bytes())
	return nil
}

func (h *textHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = slices.Clone(h.attrs)
	for _, a := range as {
		c.attrs = appendTextAttr(c.attrs, h.group, a)
	}
	return &c
}

func (h *textHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.group = h.group + name + "."
	return &c
}

// oneLine escapes the line breaks of a message, which would otherwise
// split one event over lines.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\n\r") {
		return s
	}
	return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(s)
}

func appendTextAttr(attrs [][2]string, prefix string, a slog.Attr) [][2]string {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			attrs = appendTextAttr(attrs, prefix+a.Key+".", g)
		}
		return attrs
	}
	if a.Key == "" {
		return attrs
	}
	s := v.String()
	if v.Kind() == slog.KindTime {
		s = v.Time().Format(time.RFC3339Nano)
	}
	return append(attrs, [2]string{prefix + a.Key, s})
}
