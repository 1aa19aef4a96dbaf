package idemotel

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log keys LogHandler adds.
const (
	LogKeyTraceID = "trace_id"
	LogKeySpanID  = "span_id"
)

// LogHandler wraps h so that every record logged with a context that
// carries a span (slog's *Context methods, which idemkit's packages use for
// what concerns one message or request) gets that span's trace_id and
// span_id: the log line of a failing message leads to its trace. Records
// without a span pass through unchanged.
func LogHandler(h slog.Handler) slog.Handler { return &logHandler{h: h} }

type logHandler struct{ h slog.Handler }

func (l *logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.h.Enabled(ctx, level)
}

func (l *logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(LogKeyTraceID, sc.TraceID().String()), slog.String(LogKeySpanID, sc.SpanID().String()))
	}
	return l.h.Handle(ctx, r)
}

func (l *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logHandler{h: l.h.WithAttrs(attrs)}
}

func (l *logHandler) WithGroup(name string) slog.Handler { return &logHandler{h: l.h.WithGroup(name)} }
