// Package outbox makes side effects part of the business transaction: a
// transactional outbox on PostgreSQL, a relay that publishes to Kafka, and a
// dispatcher that runs Go handlers for effects that are not Kafka messages.
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
//     holds with any number of relays, across crashes, retries and parked
//     messages: a duplicate may appear after later messages, but the first
//     delivery of each message is in order.
//   - A message with NotBefore is not delivered before that time (database
//     clock), and neither are the later messages of its key; other keys do
//     not wait for it, however many messages its key holds.
//   - Failures are retried with jittered exponential backoff (RetryInitial
//     up to RetryMax, per message). A message that keeps failing is parked
//     after ParkAfter attempts, at once for errors that cannot succeed
//     (too large for MaxBatchBytes, an invalid topic, a handler error wrapped
//     with retry.Permanent). Broker outages (network errors, timeouts,
//     leader elections) are retried without end and never park. A parked
//     message holds back the later messages of its key (they are parked
//     "blocked by" it) and nothing else. Store.Parked lists them with their
//     errors; Store.Retry requeues a message and the ones blocked behind it.
//   - Outages: when PostgreSQL or Kafka cannot be reached (at start or
//     later: refused or lost connections, unavailable brokers, timeouts;
//     retry.IsConnection), the relay and the dispatcher wait with jittered
//     backoff and carry on where they were once it is back; an outage is
//     logged once when it starts (Warn) and once when it ends (Info, with
//     its duration), not at every try. Run returns only when MaxOutage is
//     set and an outage lasts longer: a *retry.OutageError.
//   - Published rows are deleted by each relay after Retention (default 24h),
//     in batches of CleanupBatch; parked and pending rows are never deleted.
//     The table and its indexes are created by package migrate (versions 2
//     and 5): no DDL at run time.
//
// # Design: per-key order, late commits and several relays
//
// Every row has a seq from an identity column (cache 1, so it grows with
// time across sessions) and a lock_key: a 64-bit hash of the table, the
// destination and the key (of the ID when there is no key). A relay works in
// rounds; each round is one transaction:
//
//  1. Scan. Walk the due rows, the longest-waiting first (available_at,
//     then seq), and try pg_try_advisory_xact_lock(lock_key) for each,
//     stopping after BatchSize rows whose lock this transaction holds. A key
//     another relay holds is passed over at once, like SKIP LOCKED at the
//     granularity of a key: relays never wait for each other and take
//     disjoint keys. The walk is a range that ends at now() of a partial
//     index (migrate version 5): rows that are not due yet (not-before,
//     retry backoff) are never read, nor are the dispatcher's rows (the
//     relay's index holds Kafka rows only; the dispatcher's is ordered by
//     handler, and it scans its handlers one after the other).
//  2. Read. With the locks held, a new statement reads the unpublished rows
//     of the locked keys in seq order, in a new snapshot (rounds begin as
//     READ COMMITTED, whatever default_transaction_isolation says): each
//     key's first BatchSize/keys rows (at least one), and the due rows the
//     scan found. A relay that held a key before has committed its marks
//     before its lock was released, so this snapshot sees them: a row is
//     never published twice by relays in turn, and never published while
//     another relay publishes its key.
//  3. Prefix. For each key, only the rows up to the first row that is
//     parked or not due (not-before, backoff) are deliverable; the rest wait
//     for it: rows behind a parked row are parked as blocked by it, due rows
//     behind a row that is not due are deferred to its time (so the scan
//     does not meet them again meanwhile). A due row the scan found past its
//     key's first rows, with no such row among them, waits for a later
//     round: a key that waits never holds back the others.
//  4. Deliver the prefixes — one Kafka write per topic, rows in seq order,
//     at most BatchSize messages and MaxBatchBytes bytes, so kafka-go sends
//     each partition's share as one produce request: all or nothing. A key
//     stops at its first failed message.
//  5. Mark delivered rows published, record failures (attempts, error, next
//     time, parking), commit. The commit releases the key locks.
//
// A crash anywhere before the commit rolls the transaction back: the locks
// go with the connection and the rows are untouched, so another relay (or
// the restarted one) delivers them again with the same IDs.
//
// Late commits: nothing ever reads the table with a "last seen seq" cursor.
// A row of a transaction that has not committed is invisible, not skipped:
// every round scans all due rows from the lowest available_at (a row's
// enqueue time, the start of its transaction, unless it was delayed), so the
// row is found as soon as its transaction commits, whatever was published
// meanwhile. Commit order equals seq order for transactions that do not
// overlap (the later one took its seq after the earlier one committed), and
// a key's rows are published in seq order by one relay at a time, which
// gives the order guarantee above. (Ordering overlapping transactions by seq
// too would require the relay to wait for every transaction that might still
// commit a lower seq, e.g. with xid8 and pg_snapshot_xmin, which would let
// any long transaction in the database stall the outbox; idemkit does not.)
//
// Latency: EnqueueTx sends pg_notify(Store.Channel()) in its statement, which
// PostgreSQL delivers at commit; each relay LISTENs on a connection of its
// own and starts a round at once. PollInterval is the fallback (a lost
// connection, delayed and retried messages). A round that delivered
// something is followed by another at once; an empty one waits.
//
// # Dispatcher
//
// A Message with Handler set is not for Kafka: a Dispatcher that registered
// that handler name claims it with the same rounds, locks and order, and
// calls the handler after the enqueuing transaction committed, while its
// round's transaction holds the key. A round scans the dispatcher's handlers
// one after the other, starting with the next one each round, so that a
// handler's backlog delays another handler's messages by a round at most. The handler may run more than once for
// one message (a crash after it returned, a lost commit): it must pass
// Record.ID to the provider as the idempotency key, which makes the
// external effect happen once.
//
// # Metrics
//
// Hooks.Published, Failed and Parked report each round's outcome;
// Hooks.Stats reports, every StatsInterval, the backlog (pending messages),
// the age of the oldest one, and the number of parked messages (also
// available on demand with Store.Stats). Hooks.AfterPublish runs between
// delivery and marking, the point where a crash causes a redelivery; the
// fault tests kill the process there.
package outbox
