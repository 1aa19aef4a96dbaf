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
// # Design of the relay: shards, ready rows, pipelined rounds
//
// Every row has a seq from an identity column (cache 1, so it grows with
// time across sessions) and a lock_key: a 64-bit hash of the table, the
// destination and the key (of the ID when there is no key).
//
// Shards. The Kafka keys are split into 64 shards (lock_key & 63). A relay
// leases shards with session advisory locks (pg_try_advisory_lock of the
// table's namespace and the shard) on a connection of its own, the lease,
// held across rounds; a shard has one holder at a time. Every relay also
// holds a shared "member" lock, so relays count each other in pg_locks;
// every 50ms (10ms while it holds less than its share) each takes free
// shards or gives back shards until it holds its share, ceil(64/relays). A relay gives a shard back only after
// everything it published is committed as published; the next holder
// acquires the lock after that and reads in later statements, so it sees
// those marks. A relay whose lease connection is lost loses its shards with
// it (PostgreSQL releases them), and stops at its next statement on it.
// There is no lock per row or per round: this is what makes a round cost
// about what a plain SKIP LOCKED loop's does.
//
// Ready rows. A Kafka row is ready when it is pending (not published, not
// dead), not held behind another row (blocked_by) and not waiting. A row
// waits when it has a time of its own — enqueued with NotBefore, or in
// retry backoff — or when it is dead (a dead head). A relay reads the
// first BatchSize ready rows of its shards in seq order from one partial
// index; waiting rows and rows held behind another are
// not in that index, so they cost nothing. The rows of a key are kept a
// prefix: for each ready row the read probes the index of waiting rows (a
// usually empty index, and when it is empty the probes are skipped) for the
// first waiting row of its key with a lower seq; if there is one, the row
// is held behind it — deferred (blocked_by set) behind a row that waits for
// a time, dead behind a dead row — and leaves the ready index. Waiting
// rows whose time has come are made ready again by the relay (at most
// every min(PollInterval, Retry.InitialInterval), and at once when a retry it
// scheduled is due), together with the rows deferred behind them; Retry
// does it for a dead row and the rows dead behind it. A ready row that
// is not due (written by an older EnqueueTx) is made waiting on sight and
// holds its key like any waiting row.
//
// Rounds. A round publishes the rows of one read, all topics and
// partitions at once: one produce request per partition leader, one record
// batch per partition with that partition's rows in seq order, all or
// nothing (MaxBatchBytes keeps a round within one request). While a full
// batch is being published, one round trip on the lease commits the
// previous round's transaction (its rows were acknowledged) and, in a new
// transaction, writes this round's holds, marks this round's rows
// published, wakes due waiting rows and reads the next round's rows, which
// therefore leave out this round's. That transaction commits only after
// Kafka acknowledged the round: in the next round's round trip, or before
// the relay waits. If a delivery failed, it is rolled back (with the rows
// it read) and the round's true outcome — rows published, the failure
// recorded (attempts, error, backoff: the row waits; or dead), nothing
// for the rows of its key after it, which the next read holds behind it —
// is written before the next read. A round that drains the backlog (its
// read was not a full batch) writes its outcome with the next round's
// read, in one round trip, or on its own within 50ms if none comes.
//
// Order. Take two messages a before b of one key, b's transaction having
// begun after a's committed, or a before b in one transaction: then a's
// seq is lower. Whenever b is published, a was published before or in the
// same round, in front of it: the round that publishes b read it as a
// ready row, in a read that scans the ready rows of b's shard from the
// lowest seq (no cursor) in a snapshot taken after a's commit (b's
// transaction began after it). In that snapshot a is published (its first
// delivery happened earlier), or ready (then it is read before b, as the
// read takes a prefix in seq order, and published before b: same
// partition, same record batch or an earlier round's, acknowledged first),
// or waiting or held (then b is held behind it, or behind a waiting row
// before it: the probe finds the first waiting row of the key below b).
// Only the holder of b's shard publishes b's key, and a new holder starts
// after the previous one's marks are committed. Rows made ready again
// (woken up, retried) go back to their place in seq order, before any row
// of their key that was held behind them. Overlapping transactions that
// write the same key have no defined relative order (each message goes
// out once its own transaction has committed). A duplicate — a crash
// between the acknowledgement and the commit, a lost lease connection —
// may come after later messages of its key; the first delivery of every
// message is in order.
//
// Late commits. Nothing reads the table with a "last seen seq" cursor, and
// nothing skips a row: a row of a transaction that has not committed is
// invisible to a read, not passed over; every read starts from the lowest
// ready seq, so the first read after the commit finds it, whatever was
// published meanwhile. Rows read ahead are published only if they were
// read after the commit of the round before them, and a round whose
// delivery failed drops what it read ahead. (Ordering overlapping
// transactions by seq too would require the relay to wait for every
// transaction that might still commit a lower seq, e.g. with xid8 and
// pg_snapshot_xmin, which would let any long transaction in the database
// stall the outbox; idemkit does not.)
//
// A crash anywhere rolls back the open transaction: the rows are untouched
// (their marks were not committed), the shard locks go with the
// connection, and another relay (or the restarted one) publishes them
// again with the same IDs.
//
// Wake-ups. EnqueueTx sends pg_notify(Store.Channel()) in its statement,
// which PostgreSQL delivers at commit; each relay LISTENs on a connection
// of its own. An idle relay woken by a notification waits WakeDelay (5ms
// by default) more before it reads, and drops the notifications that came
// meanwhile: a burst of commits costs one round, a steady trickle at most
// a round per WakeDelay plus the round itself. A relay drains (one round
// after another, pipelined) as long as its reads return full batches,
// then waits again. PollInterval is the fallback (a lost connection,
// waiting rows whose time has come).
//
// # Dispatcher
//
// A Message with Handler set is not for Kafka: a Dispatcher that registered
// that handler name claims it and calls the handler after the enqueuing
// transaction committed. The dispatcher works in rounds: each
// round is one transaction that walks the due rows of its handlers by
// available_at, takes without waiting the transaction-level advisory lock
// of each row's key (like SKIP LOCKED at the granularity of a key), reads
// the locked keys' first rows in seq order and delivers each key's prefix
// of due rows while the transaction holds the key, then marks them and
// commits, which releases the keys. A round scans the dispatcher's handlers
// one after the other, starting with the next one each round, so that a
// handler's backlog delays another handler's messages by a round at most. The handler may run more than once for
// one message (a crash after it returned, a lost commit): it must pass
// Record.ID to the provider as the idempotency key, which makes the
// external effect happen once.
//
// # Metrics
//
// Config.Observers take a round's events: a PublishObserver its records
// once their marks are committed, a FailureObserver each failure (to be
// tried again, or dead), a StatsObserver, every StatsInterval, the
// backlog (pending messages), the age of the oldest one, and the number of
// dead messages (also available on demand with Store.Stats). A
// DeliveryObserver sees the records between their delivery and the commit
// of their marks, the point where a crash causes a redelivery; the fault
// tests kill the process there.
package outbox
