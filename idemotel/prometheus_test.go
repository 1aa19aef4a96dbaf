package idemotel_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/monitor"
	"github.com/idemkit/idemkit/retry"
)

// ours says whether a metric name is one of the consumer's, the dedup
// store's or the dead-letter package's: the ones this module exports today
// (the outbox's and idemhttp's come later).
func ours(name string) bool {
	return strings.HasPrefix(name, "idemkit_consumer_") || strings.HasPrefix(name, "idemkit_dedup_") ||
		strings.HasPrefix(name, "idemkit_dlq_") || strings.HasPrefix(name, "idemkit_dead_letter_") ||
		strings.HasPrefix(name, "idemkit_monitor_") || slices.Contains(monitorGauges, name)
}

// monitorGauges are the outbox and HTTP gauges a Monitor exports.
var monitorGauges = []string{"idemkit_outbox_backlog_messages", "idemkit_outbox_oldest_age_seconds",
	"idemkit_outbox_dead_messages", "idemkit_outbox_held_messages", "idemkit_http_stuck_records"}

// alertMetrics returns the idemkit_ metric names used by the expressions of
// the alert rules.
func alertMetrics(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../deploy/prometheus/idemkit-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	name := regexp.MustCompile(`idemkit_\w+`)
	var names []string
	inExpr, exprIndent := false, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		indent := len(line) - len(trimmed)
		switch {
		case strings.HasPrefix(trimmed, "expr:"):
			inExpr, exprIndent = true, indent
			line = strings.TrimPrefix(trimmed, "expr:")
		case inExpr && (trimmed == "" || indent > exprIndent):
			// a continuation line of a block expression
		default:
			inExpr = false
			continue
		}
		for _, n := range name.FindAllString(line, -1) {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) < 10 {
		t.Fatalf("found only %v in the alert rules' expressions", names)
	}
	return names
}

// docRow is a row of the metrics table of docs/observability.md.
type docRow struct {
	name, kind string
	labels     []string
}

// docMetrics returns the rows of the metrics table of docs/observability.md.
func docMetrics(t *testing.T) []docRow {
	t.Helper()
	b, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	paren := regexp.MustCompile(`\([^)]*\)`)
	var rows []docRow
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`idemkit_") {
			continue
		}
		r := docRow{name: strings.Trim(strings.TrimSpace(cells[1]), "`"), kind: strings.TrimSpace(cells[2])}
		for _, l := range strings.Split(paren.ReplaceAllString(cells[3], ""), ",") {
			if l = strings.TrimSpace(l); l != "" {
				r.labels = append(r.labels, l)
			}
		}
		rows = append(rows, r)
	}
	if len(rows) < 20 {
		t.Fatalf("found only %d rows in the metrics table", len(rows))
	}
	return rows
}

// TestPrometheusNames runs a consumer (with a dead letter, a retry and a
// replay) instrumented through OpenTelemetry's Prometheus exporter, scrapes
// the exporter's handler, and checks that every consumer, dedup and dlq
// metric the alert rules and docs/observability.md name is there, with the
// documented type and labels.
func TestPrometheusNames(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	dlqTopic := e.topic + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dlqTopic, 1)
	// The daily dedup layout, for its gauge (text IDs stay in the flat table).
	if _, err := e.store.EnableDaily(context.Background(), e.db.Pool, dedup.DailyConfig{}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	tel, err := idemotel.New(&idemotel.Config{MeterProvider: mp, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}

	e.produce(msg("a", "k1"), msg("b", "k2"), msg("flaky", "k3"), msg("bad", "k4"), msg("a", "k1"))
	flaky := true
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "bad":
			return retry.Permanent(errors.New("rejected"))
		case m.ID == "flaky" && flaky:
			flaky = false // one partition's worker calls this: no race
			return errors.New("try again")
		}
		return e.effect(ctx, tx, m)
	})
	cfg.Retention = 24 * time.Hour
	oc := newOutcomes(5)
	testobs.Of(cfg).OnOutcome = oc.hook
	c, err := tel.Consumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wcfg := &dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group}
	if err := c.DeadLetterWriter(wcfg); err != nil {
		t.Fatal(err)
	}
	w, err := dlq.NewWriter(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cfg.OnFailure = c.DeadLetters(w)
	// An outage, as the runner reports one (its op names the consumer, the
	// topic and a partition; the label keeps what was waited for).
	outages := cfg.Observers[0].(consumer.OutageObserver)
	op := "consumer " + e.group + "/" + e.topic + ": postgres partition 1"
	outages.OutageStarted(context.Background(), &consumer.OutageEvent{Op: op, Err: errors.New("connection refused")})
	outages.OutageEnded(context.Background(), &consumer.OutageEvent{Op: op, Duration: time.Second})
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Observe(r); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	run(t, r)
	wait(t, oc.done, "5 outcomes")

	rcfg := &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: dlqTopic, Mode: dlq.Redrive,
		Handler: consumer.HandlerFunc(e.effect), Tables: e.store.Tables()}
	if err := tel.Reprocessor(rcfg); err != nil {
		t.Fatal(err)
	}
	rp, err := dlq.NewReprocessor(e.db.Pool, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := rp.Run(ctx); err != nil {
		t.Fatal(err)
	}
	// A Monitor, with an outbox and an idempotency record table in the
	// schema, for the gauges it exports.
	mon, err := tel.Monitor(e.db.Pool, &idemotel.MonitorConfig{Config: monitor.Config{Kafka: testenv.Kafka(t), Tables: e.store.Tables()}, DeadLetterTopics: []string{dlqTopic}})
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	mctx, stopMonitor := context.WithCancel(context.Background())
	monitorDone := make(chan error, 1)
	go func() { monitorDone <- mon.Run(mctx) }()
	defer func() { stopMonitor(); <-monitorDone }()

	// Wait until the runner holds both partitions (lag and position per
	// partition), then scrape.
	deadline := time.Now().Add(30 * time.Second)
	for len(r.Partitions()) != 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	var body []byte
	// Scrape until the Monitor's first collection is in it.
	for !strings.Contains(string(body), "idemkit_monitor_snapshot_age_seconds") {
		if time.Now().After(deadline) {
			t.Fatalf("no Monitor collection in 30s:\n%s", body)
		}
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse the scrape: %v\n%s", err, body)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.Contains(line, "idemkit_") && !strings.Contains(line, "_bucket{") {
			t.Log(line)
		}
	}

	for _, n := range alertMetrics(t) {
		if ours(n) && families[n] == nil {
			t.Errorf("the alert rules use %s; the scrape does not have it", n)
		}
	}
	for _, row := range docMetrics(t) {
		if !ours(row.name) {
			continue
		}
		f := families[row.name]
		if f == nil {
			t.Errorf("docs/observability.md names %s; the scrape does not have it", row.name)
			continue
		}
		if got := strings.ToLower(f.GetType().String()); got != row.kind {
			t.Errorf("%s is a %s, the docs say %s", row.name, got, row.kind)
		}
		for _, m := range f.GetMetric() {
			var got []string
			for _, l := range m.GetLabel() {
				if !strings.HasPrefix(l.GetName(), "otel_scope_") {
					got = append(got, l.GetName())
				}
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(row.labels))
			if !slices.Equal(got, want) {
				t.Errorf("%s has labels %v, the docs say %v", row.name, got, want)
				break
			}
		}
	}
	if f := families["idemkit_consumer_outages_total"]; f != nil {
		for _, l := range f.GetMetric()[0].GetLabel() {
			if l.GetName() == "op" && l.GetValue() != "postgres partition" {
				t.Errorf("outage op label %q, want %q", l.GetValue(), "postgres partition")
			}
		}
	}
	// The scrape has none of ours that the docs do not list.
	for n := range families {
		if !ours(n) {
			continue
		}
		if !slices.ContainsFunc(docMetrics(t), func(r docRow) bool { return r.name == n }) {
			t.Errorf("the scrape has %s, which docs/observability.md does not list", n)
		}
	}
}

// TestNewPrometheus: one call gives a Telemetry and the handler a
// Prometheus server scrapes: the consumer's counters are there, at zero,
// under the documented names.
func TestNewPrometheus(t *testing.T) {
	t.Parallel()
	if _, _, err := idemotel.NewPrometheus(&idemotel.Config{MeterProvider: sdkmetric.NewMeterProvider()}); !errors.Is(err, idemotel.ErrInvalidConfig) {
		t.Fatalf("NewPrometheus with a MeterProvider: %v, want ErrInvalidConfig", err)
	}
	tel, handler, err := idemotel.NewPrometheus(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &consumer.Config{Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}, Topic: "payments", GroupID: "billing",
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })}
	if _, err := tel.Consumer(cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^idemkit_consumer_messages_total\{consumer="billing",.*outcome="applied".*topic="payments"\} 0$`)
	if !want.Match(body) {
		t.Fatalf("the scrape has no applied counter at 0 for billing:\n%s", body)
	}
}
