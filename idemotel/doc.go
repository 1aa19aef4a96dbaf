// Package idemotel turns idemkit's seams into OpenTelemetry traces and
// metrics. It lives in a module of its own (github.com/idemkit/idemkit/idemotel),
// so that the library's module depends on no telemetry library.
//
// # Installing it
//
// One Telemetry serves a whole program; each component gets one call that
// wires it into the component's configuration, chaining (never replacing)
// the hooks, middleware and callbacks the configuration already has:
//
//	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
//	c, err := tel.Consumer(&cfg)      // spans, counters, histograms
//	cfg.OnFailure = c.DeadLetters(w)  // optional: count dead letters of a dlq.Writer
//	r, err := consumer.New(pool, &cfg)
//	err = c.Observe(r)                // gauges of the partitions r holds
//	defer c.Close()
//	err = tel.Relay(store, &relayCfg) // outbox relay counters
//	err = tel.Reprocessor(&rcfg)      // optional: count replays of a dlq.Reprocessor
//	err = tel.Webhook(&wcfg)          // webhook deliveries by provider (before webhook.New)
//	m, err := tel.Monitor(pool, &mcfg) // gauges from the tables and topics
//	go m.Run(ctx)                     // collects every 15s in the background
//
// TracerProvider and MeterProvider default to the global providers; a
// no-op provider turns traces or metrics off.
//
// Example wires a consumer with metrics on /metrics and traces through the
// program's tracer provider; ExampleTelemetry_Consumer, ExampleTelemetry_Inject,
// ExampleTelemetry_Monitor and ExampleTelemetry_Consumer_all show the
// counters of one run, a trace carried from producer to consumer, a Monitor's
// gauges and everything the module offers for one consumer.
//
// # Contract
//
// Traces. Each transaction of the consumer (one message, or a batch of one
// partition) has one span of kind consumer named "process <topic>", covering
// claim, handler and commit; the handler's context carries it. The trace
// context of a consumed message is read from its Kafka headers
// (Config.Propagator; W3C trace context and baggage by default): a
// one-message span is a child of the producer's span, a batch span links to
// each message's. Attributes follow the messaging semantic conventions,
// plus AttrConsumer, AttrAttempt, AttrOutcome, AttrApplied, AttrDuplicate
// and AttrParked. Telemetry.Inject writes the current trace context into
// headers to be produced; Telemetry.Outbox does it for every message an
// outbox.Store enqueues.
//
// Logs. LogHandler wraps a slog.Handler so that records logged with a
// context carrying a span get trace_id and span_id; the consumer logs what
// concerns one message with its transaction's context.
//
// Metrics. The instruments are named so that OpenTelemetry's Prometheus
// exporter, with its default translation strategy, exports exactly the
// names, types and labels listed in docs/observability.md, which the alert
// rules of deploy/prometheus/idemkit-alerts.yml use. The label consumer is
// the consumer's dedup name (consumer.Config.Name, by default its GroupID).
// Counters of a consumer's known label sets start at zero when Consumer is
// called. A runner's gauges (Consumer.Observe) are read from
// consumer.Runner.Partitions without I/O and vanish with the runner; a
// Monitor's gauges are what package monitor reads from PostgreSQL and Kafka
// every MonitorConfig.Interval, and a scrape serves the last collection.
// Across processes, aggregate lag and position with max per partition. An
// idemhttp.Config.Operation of your own must keep its values few: each
// value is a series of the HTTP metrics.
//
// The design (span attributes, the full list of instruments, how runner
// and Monitor gauges combine, what the instrumentation costs and how to
// measure it) is explained in docs/design/idemotel.md in the repository.
package idemotel
