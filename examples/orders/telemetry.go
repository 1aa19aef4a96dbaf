package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idemkit/idemotel"
)

// telemetry is the demo's OpenTelemetry: metrics served on /metrics by
// OpenTelemetry's Prometheus exporter, spans kept in memory to print one
// event's trace at the end.
type telemetry struct {
	tel      *idemotel.Telemetry
	tracer   trace.Tracer
	spans    *tracetest.SpanRecorder
	server   *http.Server
	addr     string
	shutdown func(context.Context) error
}

// startTelemetry serves /metrics on addr (host:port; port 0 picks one).
func startTelemetry(addr string) (*telemetry, error) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, metrics, err := idemotel.NewPrometheus(&idemotel.Config{TracerProvider: tp})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t := &telemetry{tel: tel, tracer: tp.Tracer("orders-demo"), spans: spans, server: srv, addr: ln.Addr().String()}
	t.shutdown = func(ctx context.Context) error {
		return errors.Join(srv.Shutdown(ctx), tp.Shutdown(ctx))
	}
	return t, nil
}

// printTrace prints the trace of the event with the given message ID: the
// producer's span and the consumer's spans that continued it.
func (t *telemetry) printTrace(w io.Writer, messageID string) {
	var traceID trace.TraceID
	for _, s := range t.spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "messaging.message.id" && kv.Value.AsString() == messageID {
				traceID = s.SpanContext().TraceID()
			}
		}
	}
	if !traceID.IsValid() {
		fmt.Fprintf(w, "   (no span for %s)\n", messageID)
		return
	}
	var lines []string
	spans := t.spans.Ended()
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].StartTime().Before(spans[j].StartTime()) })
	for _, s := range spans {
		if s.SpanContext().TraceID() != traceID {
			continue
		}
		var attrs []string
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "messaging.message.id", "messaging.destination.partition.id", "messaging.kafka.offset",
				"idemkit.outcome", "idemkit.attempt":
				attrs = append(attrs, fmt.Sprintf("%s=%s", kv.Key, kv.Value.Emit()))
			}
		}
		if s.Status().Code == codes.Error {
			attrs = append(attrs, "rolled back: "+s.Status().Description)
		}
		parent := "root"
		if s.Parent().IsValid() {
			parent = "child of " + s.Parent().SpanID().String()
		}
		lines = append(lines, fmt.Sprintf("   span %s %-28q %s %s", s.SpanContext().SpanID(), s.Name(), parent,
			strings.Join(attrs, " ")))
	}
	fmt.Fprintf(w, "   trace %s:\n%s\n", traceID, strings.Join(lines, "\n"))
}
