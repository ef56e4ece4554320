package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// devLog is the development fleet's one log stream: the lines of dev
// itself, of its in-process control plane and dispatcher, and of every
// replica process, each marked with its source. In text form a line is
//
//	15:04:05.000 replica-2  INFO  draining in_flight=0
//
// without the attributes that repeat on every line of a source (its
// component, replica and instance IDs, DIDs, manifest digest); in JSON form
// every line is the source's JSON object with a "process" member added.
type devLog struct {
	mu   sync.Mutex
	w    io.Writer
	json bool
	// debug keeps the per-step bootstrap lines of the replicas, which text
	// form otherwise leaves out.
	debug bool
}

// srcWidth aligns the source column.
const srcWidth = 10

// quietAttrs repeat on every line of a source; text form leaves them out.
var quietAttrs = map[string]bool{
	"component": true, "replica_id": true, "instance_id": true, "manifest_digest": true, "did": true, "replica_did": true,
}

func (l *devLog) write(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(b)
}

// text renders one line in text form.
func (l *devLog) text(source string, t time.Time, level, msg string, attrs [][2]string) {
	var b bytes.Buffer
	b.WriteString(t.Local().Format("15:04:05.000"))
	b.WriteByte(' ')
	b.WriteString(source)
	for i := len(source); i < srcWidth; i++ {
		b.WriteByte(' ')
	}
	b.WriteByte(' ')
	level = strings.ToUpper(level)
	b.WriteString(level)
	for i := len(level); i < 5; i++ {
		b.WriteByte(' ')
	}
	b.WriteByte(' ')
	b.WriteString(msg)
	for _, a := range attrs {
		if quietAttrs[a[0]] || a[1] == "" {
			continue
		}
		b.WriteByte(' ')
		b.WriteString(a[0])
		b.WriteByte('=')
		v := a[1]
		if strings.ContainsAny(v, " \t\"=") {
			v = strconv.Quote(v)
		}
		b.WriteString(v)
	}
	b.WriteByte('\n')
	l.write(b.Bytes())
}

// event logs a line of dev's own at info level.
func (l *devLog) event(source, msg string, kv ...any) {
	slog.New(l.handler(source, slog.LevelInfo)).Info(msg, kv...)
}

// relay writes one line a replica process logged (JSON, or anything else
// verbatim).
func (l *devLog) relay(source string, line []byte) {
	line = bytes.TrimRight(line, "\r\n")
	if len(line) == 0 {
		return
	}
	if l.json {
		if line[0] == '{' {
			b := make([]byte, 0, len(line)+32)
			b = append(b, `{"process":`...)
			b = strconv.AppendQuote(b, source)
			if len(line) > 2 {
				b = append(b, ',')
			}
			b = append(b, line[1:]...)
			l.write(append(b, '\n'))
			return
		}
		raw, _ := json.Marshal(map[string]string{"process": source, "msg": string(line)})
		l.write(append(raw, '\n'))
		return
	}
	var rec map[string]any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if line[0] != '{' || dec.Decode(&rec) != nil {
		l.text(source, time.Now(), "", string(line), nil)
		return
	}
	msg, _ := rec["msg"].(string)
	if msg == "bootstrap step" && !l.debug {
		return
	}
	level, _ := rec["level"].(string)
	t := time.Now()
	if ts, ok := rec["time"].(string); ok {
		if parsed, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			t = parsed
		}
	}
	delete(rec, "msg")
	delete(rec, "level")
	delete(rec, "time")
	keys := make([]string, 0, len(rec))
	for k := range rec {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	attrs := make([][2]string, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, [2]string{k, attrText(rec[k])})
	}
	l.text(source, t, level, msg, attrs)
}

func attrText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	case json.Number, bool:
		return fmt.Sprint(x)
	}
	raw, _ := json.Marshal(v)
	return string(raw)
}

// handler returns a slog.Handler writing source's lines to the stream.
func (l *devLog) handler(source string, level slog.Leveler) slog.Handler {
	if l.json {
		return slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) { l.relay(source, p); return len(p), nil }),
			&slog.HandlerOptions{Level: level})
	}
	return &textHandler{log: l, source: source, level: level}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// textHandler is the text form of a source's in-process logger.
type textHandler struct {
	log    *devLog
	source string
	level  slog.Leveler
	attrs  [][2]string
	group  string
}

func (h *textHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h *textHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := slices.Clone(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		attrs = appendAttr(attrs, h.group, a)
		return true
	})
	h.log.text(h.source, r.Time, r.Level.String(), r.Message, attrs)
	return nil
}

func (h *textHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = slices.Clone(h.attrs)
	for _, a := range as {
		c.attrs = appendAttr(c.attrs, h.group, a)
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

func appendAttr(attrs [][2]string, prefix string, a slog.Attr) [][2]string {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			attrs = appendAttr(attrs, prefix+a.Key+".", g)
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
