package hostrun

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestNewLoggerText(t *testing.T) {
	var b bytes.Buffer
	l := NewLogger(&b, LogText, slog.LevelInfo).With("component", "x").WithGroup("g")
	l.Debug("hidden")
	l.Info("two\nlines", "k", "v w", "n", 3, "empty", "", slog.Group("sub", "a", `q"`))
	l.Warn("plain", "t", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(got) != 2 {
		t.Fatalf("want 2 lines (debug filtered, the newline escaped), got %d:\n%s", len(got), b.String())
	}
	for i, want := range []string{
		` level=INFO msg="two\nlines" component=x g.k="v w" g.n=3 g.empty="" g.sub.a="q\""`,
		` level=WARN msg=plain component=x g.t=2026-01-02T03:04:05.000Z`,
	} {
		ts, rest, ok := strings.Cut(got[i], " ")
		if !ok || " "+rest != want {
			t.Errorf("line %d:\n got %s\nwant time=<time>%s", i, got[i], want)
		}
		if _, err := time.Parse("time=2006-01-02T15:04:05.000Z07:00", ts); err != nil || !strings.HasSuffix(ts, "Z") {
			t.Errorf("line %d does not start with the time in UTC: %v", i, err)
		}
	}
}

func TestNewLoggerJSONByDefault(t *testing.T) {
	for _, format := range []string{"", LogJSON} {
		var b bytes.Buffer
		NewLogger(&b, format, slog.LevelInfo).Info("hello", "k", 1)
		var rec map[string]any
		if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["msg"] != "hello" {
			t.Errorf("format %q: %v %s", format, err, b.String())
		}
	}
}

func TestLogFormatSetting(t *testing.T) {
	for _, v := range []string{LogJSON, LogText} {
		if err := CheckLogFormat(v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
	for _, v := range []string{"JSON", "logfmt", " text"} {
		if err := CheckLogFormat(v); err == nil || err.Error() != LogFormatWant {
			t.Errorf("%q: %v, want %q", v, err, LogFormatWant)
		}
	}
	s := LogFormatSetting("AIP_X_LOG_FORMAT")
	if s.Flag != "log-format" || s.Env != "AIP_X_LOG_FORMAT" || s.Check == nil {
		t.Errorf("%+v", s)
	}
	if _, err := ParseLogLevel("loud"); err == nil || err.Error() != LogLevelWant {
		t.Errorf("loud: %v", err)
	}
	if l, err := ParseLogLevel("warn"); err != nil || l != slog.LevelWarn {
		t.Errorf("warn: %v %v", l, err)
	}
}
