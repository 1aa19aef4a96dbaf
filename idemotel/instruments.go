package idemotel

import (
	"errors"

	"go.opentelemetry.io/otel/metric"
)

// Metric attribute keys (Prometheus labels), as docs/observability.md
// names them.
const (
	keyConsumer  = "consumer"
	keyTopic     = "topic"
	keyPartition = "partition"
	keyOutcome   = "outcome"
	keyClass     = "class"
	keyResult    = "result"
	keyOp        = "op"
	keyDLQTopic  = "dlq_topic"
	keyAction    = "action"
	keyState     = "state"
)

// consumerInstruments are the consumer's instruments. Their names, with
// OpenTelemetry's Prometheus exporter (default translation), become those
// of docs/observability.md: dots become underscores, the unit "s" adds
// "_seconds", a counter "_total", and a unit in braces adds nothing.
type consumerInstruments struct {
	messages        metric.Int64Counter       // idemkit_consumer_messages_total
	retries         metric.Int64Counter       // idemkit_consumer_retries_total
	handlerDuration metric.Float64Histogram   // idemkit_consumer_handler_duration_seconds
	txDuration      metric.Float64Histogram   // idemkit_consumer_transaction_duration_seconds
	batchMessages   metric.Int64Histogram     // idemkit_consumer_batch_messages
	rebalances      metric.Int64Counter       // idemkit_consumer_rebalances_total
	outages         metric.Int64Counter       // idemkit_consumer_outages_total
	outageActive    metric.Int64UpDownCounter // idemkit_consumer_outage_active
	commitFailures  metric.Int64Counter       // idemkit_consumer_offset_commit_failures_total
	beyondHorizon   metric.Int64Counter       // idemkit_consumer_beyond_horizon_total
	lockWait        metric.Float64Histogram   // idemkit_lock_wait_seconds

	// Observed by each Consumer's callback (Consumer.Observe) and by a
	// Monitor (Telemetry.Monitor), or by a Monitor alone.
	lag             metric.Int64ObservableGauge   // idemkit_consumer_lag
	position        metric.Int64ObservableGauge   // idemkit_consumer_position
	parked          metric.Int64ObservableGauge   // idemkit_consumer_parked_messages
	parkedOldestAge metric.Float64ObservableGauge // idemkit_consumer_parked_oldest_age_seconds
	oldestRecordAge metric.Float64ObservableGauge // idemkit_dedup_oldest_record_age_seconds
	retention       metric.Float64ObservableGauge // idemkit_dedup_retention_seconds
	partitionsAhead metric.Int64ObservableGauge   // idemkit_dedup_daily_partitions_ahead_days
	held            metric.Int64ObservableGauge   // idemkit_consumer_partitions_held
}

func newConsumerInstruments(m metric.Meter) (consumerInstruments, error) {
	var in consumerInstruments
	var errs [19]error
	in.lockWait, errs[17] = m.Float64Histogram("idemkit.lock_wait", metric.WithUnit("s"),
		metric.WithDescription("Claims that waited for another session's lock for 5s or more, by how long (an orphaned transaction, most often: see the runner's WARN for the session)."),
		metric.WithExplicitBucketBoundaries(5, 10, 20, 30, 60, 120, 300, 600))
	in.messages, errs[0] = m.Int64Counter("idemkit.consumer.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages by fate: applied, duplicate (a redelivery the claim caught), parked, failed (handed to OnFailure)."))
	in.retries, errs[1] = m.Int64Counter("idemkit.consumer.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Handler failures retried in place, by error class."))
	in.handlerDuration, errs[2] = m.Float64Histogram("idemkit.consumer.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one handler call (one message, or one batch with a BatchHandler)."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	in.txDuration, errs[3] = m.Float64Histogram("idemkit.consumer.transaction.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one message's or batch's transaction, from its start to commit or rollback (a transaction begun with the commit before it had its claims sent then)."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	in.batchMessages, errs[4] = m.Int64Histogram("idemkit.consumer.batch.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages per transaction."),
		metric.WithExplicitBucketBoundaries(batchBuckets...))
	in.rebalances, errs[5] = m.Int64Counter("idemkit.consumer.rebalances", metric.WithUnit("{rebalance}"),
		metric.WithDescription("Partition assignments of new group generations."))
	in.outages, errs[6] = m.Int64Counter("idemkit.consumer.outages", metric.WithUnit("{outage}"),
		metric.WithDescription("Outages of PostgreSQL or Kafka waited out, by what could not reach its server."))
	in.outageActive, errs[7] = m.Int64UpDownCounter("idemkit.consumer.outage_active", metric.WithUnit("{outage}"),
		metric.WithDescription("Outages the consumer is waiting out now."))
	in.commitFailures, errs[8] = m.Int64Counter("idemkit.consumer.offset_commit_failures", metric.WithUnit("{commit}"),
		metric.WithDescription("Kafka offset commits that failed."))
	in.lag, errs[9] = m.Int64ObservableGauge("idemkit.consumer.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Last stable offset minus the PostgreSQL position, per partition (a runner's: those it holds; a Monitor's: all)."))
	in.position, errs[10] = m.Int64ObservableGauge("idemkit.consumer.position", metric.WithUnit("{offset}"),
		metric.WithDescription("The next offset to process (the PostgreSQL position), per partition (a runner's: those it holds; a Monitor's: all)."))
	in.parked, errs[11] = m.Int64ObservableGauge("idemkit.consumer.parked_messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages in the parked table (NonBlocking): each failing message and the later ones of its key, from the table."))
	in.parkedOldestAge, errs[12] = m.Float64ObservableGauge("idemkit.consumer.parked_oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the consumer's oldest parked message on the topic (0 when none)."))
	in.oldestRecordAge, errs[13] = m.Float64ObservableGauge("idemkit.dedup.oldest_record_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the consumer's oldest processed-message record (absent when none, or when the search took too long)."))
	in.retention, errs[14] = m.Float64ObservableGauge("idemkit.dedup.retention", metric.WithUnit("s"),
		metric.WithDescription("The retention of processed-message records the purge promises (a Monitor's MonitorConfig.Retention)."))
	in.beyondHorizon, errs[15] = m.Int64Counter("idemkit.consumer.beyond_horizon", metric.WithUnit("{message}"),
		metric.WithDescription("Messages older than the dedup horizon whose claim was new, by what became of them: failed (handed to OnFailure) or applied (HorizonApply)."))
	in.partitionsAhead, errs[16] = m.Int64ObservableGauge("idemkit.dedup.daily_partitions_ahead", metric.WithUnit("d"),
		metric.WithDescription("With the daily dedup layout: days from today (UTC) to the newest daily partition; claims dated past it fail until partitions are created (absent with the flat layout)."))
	in.held, errs[18] = m.Int64ObservableGauge("idemkit.consumer.partitions_held", metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions a running runner holds now (0 during a rebalance; absent when no runner runs)."))
	return in, errors.Join(errs[:]...)
}

// dlqInstruments are package dlq's instruments.
type dlqInstruments struct {
	writes        metric.Int64Counter // idemkit_dlq_writes_total
	replayed      metric.Int64Counter // idemkit_dlq_replayed_total
	writeFailures metric.Int64Counter // idemkit_dead_letter_write_failures_total
	// Observed by each DeadLetterTopic's callback.
	messages metric.Int64ObservableGauge // idemkit_dlq_messages
}

func newDLQInstruments(m metric.Meter) (dlqInstruments, error) {
	var in dlqInstruments
	var errs [4]error
	in.writes, errs[0] = m.Int64Counter("idemkit.dlq.writes", metric.WithUnit("{message}"),
		metric.WithDescription("Messages written to a dead-letter topic."))
	in.replayed, errs[1] = m.Int64Counter("idemkit.dlq.replayed", metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters a reprocessor handled, by what it did with them."))
	in.writeFailures, errs[2] = m.Int64Counter("idemkit.dead_letter.write_failures", metric.WithUnit("{attempt}"),
		metric.WithDescription("Failed attempts to write a dead letter, retried or given up: the message waits meanwhile."))
	in.messages, errs[3] = m.Int64ObservableGauge("idemkit.dlq.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Origin messages of a dead-letter topic, by state (unresolved: no replay decided them)."))
	return in, errors.Join(errs[:]...)
}
