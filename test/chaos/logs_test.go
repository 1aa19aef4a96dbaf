package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// The messages internal/outage logs when a loop loses its server, regains
// it, or stops waiting for it (the loop ended: a rebalance, a shutdown).
const (
	outageStart   = "server unreachable; waiting it out"
	outageEnd     = "server reachable again"
	outageStopped = "stopped waiting for the server; the loop ended"
)

// entry is one recorded log record, its attributes flattened to strings
// (groups joined with dots).
type entry struct {
	time  time.Time
	level slog.Level
	msg   string
	attrs map[string]string
}

func (e entry) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-5s %s", e.time.Format("15:04:05.000"), e.level, e.msg)
	for _, k := range sortedKeys(e.attrs) {
		fmt.Fprintf(&b, " %s=%q", k, e.attrs[k])
	}
	return b.String()
}

// logs records what every part under test logs, at Info and above. Give
// each part its own logger with For.
type logs struct {
	mu      sync.Mutex
	entries []entry
}

// For returns a logger whose records carry part=name. (Not "component":
// the outbox relay adds component=outbox.relay itself.)
func (l *logs) For(name string) *slog.Logger {
	return slog.New(&recorder{logs: l}).With("part", name)
}

// count returns the records of part with message msg logged at or after
// since.
func (l *logs) count(part, msg string, since time.Time) int {
	return len(l.find(part, msg, since))
}

func (l *logs) find(part, msg string, since time.Time) []entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []entry
	for _, e := range l.entries {
		if e.attrs["part"] == part && (msg == "" || e.msg == msg) && !e.time.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

// outages returns part's outage records (starts and ends), oldest first.
func (l *logs) outages(part string) []entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []entry
	for _, e := range l.entries {
		if e.attrs["part"] == part && (e.msg == outageStart || e.msg == outageEnd || e.msg == outageStopped) {
			out = append(out, e)
		}
	}
	return out
}

// tail returns part's last n records, one per line.
func (l *logs) tail(part string, n int) string {
	es := l.find(part, "", time.Time{})
	if len(es) > n {
		es = es[len(es)-n:]
	}
	var b strings.Builder
	for _, e := range es {
		b.WriteString("\t" + e.String() + "\n")
	}
	return b.String()
}

// recorder is the slog.Handler behind logs.For.
type recorder struct {
	logs   *logs
	attrs  []slog.Attr
	groups []string
}

func (h *recorder) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelInfo }

func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	e := entry{time: r.Time, level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		flatten(e.attrs, "", a)
	}
	prefix := strings.Join(h.groups, ".")
	if prefix != "" {
		prefix += "."
	}
	r.Attrs(func(a slog.Attr) bool {
		flatten(e.attrs, prefix, a)
		return true
	})
	h.logs.mu.Lock()
	h.logs.entries = append(h.logs.entries, e)
	h.logs.mu.Unlock()
	return nil
}

func (h *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	prefix := strings.Join(h.groups, ".")
	if prefix != "" {
		prefix += "."
	}
	c := *h
	c.attrs = append([]slog.Attr{}, h.attrs...)
	for _, a := range as {
		c.attrs = append(c.attrs, slog.Attr{Key: prefix + a.Key, Value: a.Value})
	}
	return &c
}

func (h *recorder) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.groups = append(append([]string{}, h.groups...), name)
	return &c
}

func flatten(into map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			flatten(into, p, g)
		}
		return
	}
	into[prefix+a.Key] = v.String()
}
