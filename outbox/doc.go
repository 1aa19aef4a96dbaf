// Package outbox makes side effects part of the business transaction: a
// transactional outbox on PostgreSQL, a relay that publishes to Kafka, and a
// dispatcher that runs Go handlers for effects that are not Kafka messages.
// A service writes its rows and its messages in one transaction; the
// messages go out once it commits, and never if it rolls back.
//
// ExampleStore_EnqueueTx shows a business transaction that writes its row
// and its event together, and the relay that publishes the event after the
// commit.
//
// # Contract
//
//   - Store.EnqueueTx writes messages in the caller's pgx.Tx (a consumer
//     handler's transaction included), in one statement. Nothing is
//     delivered unless that transaction commits; once it commits, every
//     message is delivered at least once. A rollback leaves no trace.
//   - Each message gets a stable ID at enqueue (a UUIDv7 from crypto/rand),
//     returned by EnqueueTx. The relay sends it as the Kafka header HeaderID
//     ("message-id", consumer.IDHeaderDefault), so an idemkit consumer
//     deduplicates redeliveries by default; the dispatcher hands it to the
//     handler, to pass on as the provider's idempotency key. Every
//     redelivery carries the same ID: exactly-once effects downstream come
//     from deduplicating on it, at the receiver's boundary.
//   - The relay publishes with kafka-go, RequiredAcks RequireAll, partitions
//     by key (kafka.Hash, so a key stays in one partition), never creates
//     topics, and checks each message's write error. A row is marked
//     published only after Kafka acknowledged it; a crash in between
//     publishes it again (a duplicate with the same ID, never a loss).
//   - Order: messages with the same (Topic, Key) — (Handler, Key) for
//     dispatcher messages — are delivered in enqueue order. Within one
//     transaction that is the order of EnqueueTx calls and of msgs; across
//     transactions that do not overlap in time it is commit order. Two
//     transactions that overlap and write the same key have no defined
//     relative order: each message goes out once its own transaction has
//     committed. A message without a key is ordered with nothing. Order
//     holds with any number of relays, across crashes, retries and dead
//     messages: a duplicate may appear after later messages, but the first
//     delivery of each message is in order.
//   - A message with NotBefore is not delivered before that time (database
//     clock), and neither are the later messages of its key; other keys do
//     not wait for it, however many messages its key holds.
//   - Failures are retried with jittered exponential backoff (Retry, per
//     message). A message that keeps failing is given up after
//     Retry.MaxAttempts attempts, at once for errors that cannot succeed
//     (too large for MaxBatchBytes, an invalid topic, a handler error wrapped
//     with retry.Permanent): it is dead, kept until an operator requeues it.
//     Broker outages (network errors, timeouts, leader elections) are
//     retried without end and never make a message dead. A dead message
//     holds back the later messages of its key (they are dead too, "blocked
//     by" it) and nothing else. Store.Dead lists them with their errors;
//     Store.Retry requeues a message and the ones blocked behind it.
//   - Outages: when PostgreSQL or Kafka cannot be reached (at start or
//     later: refused or lost connections, unavailable brokers, timeouts;
//     retry.IsConnection), the relay and the dispatcher wait with jittered
//     backoff and carry on where they were once it is back; an outage is
//     logged once when it starts (Warn) and once when it ends (Info, with
//     its duration), not at every try. Run returns only when MaxOutage is
//     set and an outage lasts longer: a *retry.OutageError.
//   - Published rows are deleted by each relay after Retention (default 24h),
//     in batches of CleanupBatch; dead and pending rows are never deleted.
//     The table and its indexes are created by package migrate: no DDL at
//     run time. Relay.Run returns an error wrapping ErrNotMigrated when the
//     table is missing.
//
// # Dispatcher
//
// A Message with Handler set is not for Kafka: a Dispatcher that registered
// that handler name calls the handler after the enqueuing transaction
// committed, in the order of its key. The handler may run more than once
// for one message (a crash after it returned, a lost commit): it must pass
// Record.ID to the provider as the idempotency key, which makes the
// external effect happen once.
//
// RelayConfig.Observers and DispatcherConfig.Observers take the events of
// a round (PublishObserver, FailureObserver, StatsObserver,
// DeliveryObserver); Store.Stats reports the backlog, the age of its oldest
// message and the dead messages on demand.
//
// The design (shards leased with advisory locks, ready rows, pipelined
// rounds, why order holds, late commits, wake-ups, the dispatcher's rounds)
// is explained in docs/design/outbox.md in the repository.
package outbox
