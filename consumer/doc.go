// Package consumer runs a handler over a Kafka consumer group so that each
// message's business effect happens once: the handler's writes, the
// message's dedup claim and the partition's position commit in one
// PostgreSQL transaction, and only then does the Kafka offset follow. It is
// for services whose effects live in PostgreSQL and that must not apply a
// redelivered, replayed or duplicated message twice.
//
// Example shows a service that marks orders paid once per event, with
// failing messages parked per key and dead-lettered; ExampleRunner_Run and
// Example_sessionSettings show the runner's life and per-transaction
// settings.
//
// # Contract
//
// For each message (or batch of one partition, up to Config.BatchSize) the
// runner begins a transaction, claims the message ID in the dedup store
// (package dedup) and records the partition's next offset, runs the
// handler in that transaction only when the claim is new, and commits. A
// redelivered message finds its ID claimed and is acknowledged as
// OutcomeDuplicate without running the handler. The guarantee holds at the
// PostgreSQL boundary: effects outside the transaction (e-mails, calls to
// other services) need package outbox or the receiver's own idempotency.
// The handler must not end the transaction itself (that fails with an error
// wrapping pgx.ErrTxClosed).
//
// The message ID comes from the "message-id" header (Config.IDHeader) or
// Config.IDFunc. A message without a usable ID fails with ErrMissingID,
// unless Config.MissingID is MissingIDUseCoordinates.
//
// Messages of one partition are handled in offset order; a partition
// resumes from the later of Kafka's committed offset and the position
// stored with the effects, so a rewind must move both (`idemkit consumer
// seek`, or dedup.Store.SeekTx and an offset commit). Only committed records
// of transactional producers reach the handler.
//
// Failures: a handler error rolls back the effect with the claim. Transient
// errors are retried under Config.Retry (package retry), permanent ones are
// not; a message that fails for good goes to Config.OnFailure (for example
// dlq.Writer.OnFailure), and only once that accepted it does the position
// move past it. Without OnFailure, Run stops with a *MessageError.
// Config.FailureMode chooses what a failing message holds back: the whole
// partition (Blocking, the default) or only the later messages of its key,
// parked in PostgreSQL (NonBlocking; see ListParked and RetryParked).
// Panics become *idemkit.PanicError.
//
// Errors Run returns, to match with errors.Is or errors.As: ErrInvalidConfig,
// ErrNotMigrated (the tables are missing: run package migrate),
// ErrTopicNotFound (the brokers still do not know the topic after a few
// seconds of asking again: a topic created a moment ago may not have
// reached the broker asked), a *PositionError matching ErrTopicRecreated (the stored
// position does not describe the topic Kafka has; Config.OnRecreated
// RecreatedRestart starts it over instead), a *MessageError, and a
// *retry.OutageError when an outage lasts longer than Config.MaxOutage
// (unbounded by default: outages are waited out, logged once when they
// start and once when they end). ErrMessagesLost (retention deleted
// messages before they were handled) is logged and reported to
// PositionObservers, and the partition goes on.
//
// With Config.Retention, the runner purges dedup records older than
// Retention, and a message older than the horizon (Retention minus
// Config.HorizonMargin) whose claim is new is not applied by default: it
// goes to OnFailure with a *HorizonError matching ErrBeyondHorizon
// (Config.OnBeyondHorizon HorizonApply applies it instead).
//
// Config defaults: IDHeader IDHeaderDefault, BatchSize BatchSizeDefault
// (1 gives one transaction per message), BatchLinger 0 (no batch waits to
// fill), MaxPartitions MaxPartitionsDefault partitions handled at once,
// MaxBufferedBytes MaxBufferedBytesDefault fetched ahead over all
// partitions, HandlerTimeout HandlerTimeoutDefault per transaction's
// handler calls, PurgeInterval PurgeIntervalDefault, Retention zero (no
// purge and no horizon check); each field's documentation says the rest.
//
// Config.Observers and Config.Middleware are the seams metrics and tracing
// use (module github.com/idemkit/idemkit/idemotel); Runner.Partitions reports
// each held partition's position, lag and parked messages.
//
// Run returns after its context is cancelled, and only when every goroutine
// it started has exited: fetching stops, in-flight transactions end, the
// last positions are committed to Kafka, and the member leaves the group.
//
// The design (positions and anchors, transactional producers, memory
// bounds, batching and splitting, transaction timeouts, the dedup horizon)
// is explained in docs/design/consumer.md in the repository.
package consumer
