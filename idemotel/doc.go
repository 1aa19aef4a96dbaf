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
// # Traces
//
// Each transaction of the consumer — one message, or a batch of one
// partition — has one span of kind consumer named "process <topic>", opened
// in the consumer observer's TxStart before the claim and ended in TxEnd after the
// commit or rollback: it covers claim, handler and commit. The handler's
// context carries it, so spans the handler starts are its children.
//
// The trace context of a consumed message is read from its Kafka headers
// (Config.Propagator; W3C "traceparent", "tracestate" and "baggage" by
// default). A one-message transaction's span is a child of the producer's
// span and the handler's context carries the message's baggage; a batch's
// span starts a trace of its own with a link to each message's producer
// span (messages without trace headers get no link). Transactions that run
// again (a retry in place, a batch split around a failure, a serialization
// failure) get a span each; a failed one records its error and has status
// Error; one that retries a handler failure starts with the event
// EventRetry.
//
// Span attributes follow the messaging semantic conventions (semconv
// v1.43.0): messaging.system "kafka", messaging.operation.type and .name
// "process", messaging.destination.name, messaging.destination.partition.id,
// messaging.consumer.group.name, and per message messaging.message.id (the
// idemkit message ID) and messaging.kafka.offset (on the span, or on each
// link of a batch span), messaging.batch.message_count for a batch. idemkit
// adds AttrConsumer, AttrAttempt and, once the transaction committed,
// AttrOutcome (one message) or AttrApplied, AttrDuplicate and AttrParked (a
// batch).
//
// Telemetry.Inject writes the current trace context into headers to be
// produced, so that the consumer continues the trace. Telemetry.Outbox does
// it for every message an outbox.Store enqueues (outbox.Config.ContextHeaders):
// the trace of the request that enqueued it continues in the consumer of
// what the relay published.
//
// # Logs
//
// LogHandler wraps a slog.Handler so that records logged with a context
// carrying a span get trace_id and span_id. The consumer logs what concerns
// one message (a retry, a failure for good, parking) with the context of the
// transaction that failed, so with a consumer instrumented here those lines
// carry the message's trace.
//
// # Metrics
//
// The instruments are named so that OpenTelemetry's Prometheus exporter
// (go.opentelemetry.io/otel/exporters/prometheus, with its default
// translation strategy) exports exactly the names, types and labels of
// docs/observability.md, which deploy/prometheus/idemkit-alerts.yml uses:
//
//	idemkit_consumer_messages_total{consumer,topic,outcome}    applied, duplicate, parked, failed
//	idemkit_consumer_retries_total{consumer,topic,class}       transient, permanent, unknown
//	idemkit_consumer_handler_duration_seconds{consumer,topic}  histogram
//	idemkit_consumer_transaction_duration_seconds{consumer,topic,result}  commit, rollback
//	idemkit_consumer_batch_messages{consumer,topic}            histogram
//	idemkit_consumer_lag{consumer,topic,partition}             gauge (runner, Monitor)
//	idemkit_consumer_position{consumer,topic,partition}        gauge (runner, Monitor)
//	idemkit_consumer_parked_messages{consumer,topic}           gauge (Monitor)
//	idemkit_consumer_partitions_held{consumer,topic}           gauge (runner)
//	idemkit_consumer_parked_oldest_age_seconds{consumer,topic} gauge (Monitor)
//	idemkit_consumer_rebalances_total{consumer}
//	idemkit_consumer_outages_total{consumer,op}
//	idemkit_consumer_outage_active{consumer}                   gauge
//	idemkit_consumer_offset_commit_failures_total{consumer}
//	idemkit_consumer_beyond_horizon_total{consumer,topic,action}  failed, applied (with Retention)
//	idemkit_lock_wait_seconds{consumer,topic}                  histogram
//	idemkit_dedup_oldest_record_age_seconds{consumer}          gauge (Monitor)
//	idemkit_dedup_retention_seconds{consumer}                  gauge (Monitor)
//	idemkit_dedup_daily_partitions_ahead_days{schema}          gauge (Monitor, daily layout only)
//	idemkit_dlq_writes_total{consumer,topic,dlq_topic}
//	idemkit_dlq_replayed_total{dlq_topic,outcome}
//	idemkit_dead_letter_write_failures_total{consumer,topic,dlq_topic}
//	idemkit_dlq_messages{dlq_topic,state}                      gauge (Monitor with DeadLetterTopics)
//	idemkit_outbox_messages_total{table,outcome}               published, failed, dead
//	idemkit_outbox_publish_latency_seconds{table}              histogram
//	idemkit_outbox_backlog_messages{table}                     gauge (Monitor)
//	idemkit_outbox_oldest_age_seconds{table}                   gauge (Monitor)
//	idemkit_outbox_dead_messages{table}                        gauge (Monitor)
//	idemkit_outbox_held_messages{table}                        gauge (Monitor)
//	idemkit_http_requests_total{operation,outcome}
//	idemkit_http_request_duration_seconds{operation,outcome}   histogram
//	idemkit_http_stuck_records{table}                          gauge (Monitor)
//	idemkit_webhook_deliveries_total{provider,outcome}         processed, duplicate, failed, retry, in_flight, key_reused, bad_signature, bad_timestamp, invalid, unavailable
//	idemkit_webhook_delivery_duration_seconds{provider,outcome}  histogram
//	idemkit_monitor_collections_total{outcome}                 ok, failed
//	idemkit_monitor_snapshot_age_seconds                       gauge (Monitor)
//
// The exporter adds otel_scope_name, otel_scope_version and
// otel_scope_schema_url labels (ScopeName, "", the semconv schema) unless it
// is built WithoutScopeInfo; the alert rules aggregate them away. The label
// consumer is the consumer's dedup name (consumer.Config.Name, by default
// its GroupID). Counters of a consumer's known label sets start at zero when
// Consumer is called, so that increase() sees their first event.
//
// A runner's gauges (Consumer.Observe) are read at each collection from
// consumer.Runner.Partitions, without I/O, and vanish with the runner. A
// Monitor's gauges are what package monitor reads from PostgreSQL and Kafka
// in the background every MonitorConfig.Interval, on a connection of its
// own: they hold whichever process holds the partitions, and whether any
// runs; a scrape serves the last collection, never queries. In one process
// a partition's lag and position are its runner's when one holds it, the
// Monitor's otherwise; across processes, aggregate them with max per
// partition (the alert rules do).
//
// The operation label of the HTTP metrics is bounded (the method and the
// ServeMux pattern, or unmatched); an idemhttp.Config.Operation of your own
// must keep its values few: a path with IDs in it makes a series per ID.
//
// # Cost
//
// Per transaction: one span (with a link per traced message of a batch, at
// most MaxLinks), two histogram records and, per message, one counter add,
// with attribute sets built once; per handler call one histogram record.
// Messages without trace headers are not run through the propagator. With
// the SDK recording every span and metric this is about 12 µs of CPU per
// one-message transaction and 1 µs per message of a batch of 500
// (BenchmarkObserver), against a transaction that costs a PostgreSQL round
// trip or more. BenchmarkOverhead compares the consumer's throughput on the
// test servers with telemetry on and off, in interleaved runs over the same
// messages:
//
//	go test -run '^$' -bench Overhead -benchtime 5x ./idemotel
package idemotel
