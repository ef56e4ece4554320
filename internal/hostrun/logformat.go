package hostrun

import (
	"errors"
	"io"
	"log/slog"

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
//
// Text is slog's text form, logfmt: one line per event,
//
//	time=2026-12-03T16:58:14.123Z level=INFO msg="replica ready" replica_id=crepl_1 in_flight=0
//
// the time in UTC with milliseconds, then the level, the message and each
// attribute as key=value (a group's as group.key), a value quoted when it
// holds a space, a quote, an equals sign or a control character (a line
// break is written \n, so an event never spans lines).
func NewLogger(w io.Writer, format string, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == LogText {
		opts.ReplaceAttr = utcMillis
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// utcMillis writes the event's time in UTC with milliseconds.
func utcMillis(groups []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey && len(groups) == 0 && a.Value.Kind() == slog.KindTime {
		return slog.String(slog.TimeKey, a.Value.Time().UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	}
	return a
}
