// Package consumer runs a handler over a Kafka consumer group so that each
// message's business effect happens once.
//
// # Contract
//
// For each message the runner begins a pgx transaction, claims the message
// ID in the dedup store and records the partition's next offset (in the
// same round trip as BEGIN), runs the handler in that same transaction only
// when the claim is new, commits, and only then lets the Kafka offset be
// committed. A redelivered message finds its ID claimed and is acknowledged (Outcome
// Duplicate) without running the handler again. The guarantee holds at the
// PostgreSQL boundary: effects outside the transaction (e-mails, calls to
// other services, events) need the outbox or the receiver's own idempotency.
//
// The message ID comes from the "message-id" header (Config.IDHeader) or
// Config.IDFunc. A message without a usable ID is never processed without
// dedup: by default it fails with ErrMissingID; MissingIDUseCoordinates
// derives "topic/partition/offset" instead.
//
// # Positions and offsets
//
// The partition's position (the next offset to handle) is written in the
// transaction of the effects. When a partition is assigned, the runner starts
// at the later of Kafka's committed offset and that position, so a crash
// between the database commit and the Kafka offset commit costs no
// redelivery; dedup by message ID stays the second line (producer
// duplicates, replays, positions lost). What a seek rewinds over was
// claimed before the seek wrote the position: it comes back as duplicates.
// Kafka offsets are still committed,
// synchronously, by one committer per generation that sends the newest
// committed position of every partition in one request — never an offset
// whose transaction did not commit — so lag tooling keeps working. An
// offset commit the group coordinator could not write for now (on a
// cluster, while a dead replica of __consumer_offsets is still in its ISR)
// is logged once and sent again with the next commit; any other failed
// offset commit is logged and ends the generation.
//
// # Checked positions, recreated topics, lost messages
//
// With every position the runner stores the timestamp of the record just
// before it (the anchor). When a partition is assigned it asks Kafka for the
// partition's log start and end and, when the anchor record is still there,
// reads it back. A start past the log end, or an anchor record with another
// timestamp, means the position does not belong to the topic Kafka has now
// (deleted and created again, or data lost on the broker): by default
// (RecreatedStop) Run returns a *PositionError matching ErrTopicRecreated
// that names the partition, the position, the log range and the command that
// moves the consumer on; nothing is consumed from a topic the position does
// not describe. With RecreatedRestart the partition starts over at its log
// start as a new incarnation of the topic (Message.Incarnation), logged at
// ERROR and reported to PositionObservers; IDs derived from coordinates
// (CoordinateID) and dead-letter replay records include the incarnation, so
// the new topic's offsets never collide with the old one's. A start below
// the log start (retention deleted messages before they were processed)
// is reported as ErrMessagesLost with the lost range (ERROR log and
// PositionObservers), then the partition continues at the log start.
//
// To rewind or skip, move both the PostgreSQL position and Kafka's committed
// offset with `idemkit consumer seek` (or dedup.Store.SeekTx and an
// offset commit): Kafka's offset alone is overridden by the later position.
//
// # Transactional producers
//
// The runner reads committed data only, as Kafka's Java consumer does with
// isolation.level=read_committed: records of aborted transactions and
// transaction markers never reach a handler, and nothing at or past a
// partition's last stable offset is read. When a fetch ends with records no
// handler sees, the position (and then Kafka's offset) moves past them in a
// transaction of its own, so that lag reaches zero; the anchor stays on the
// last data record. A transaction left open holds its partition at its
// first offset until it commits or aborts; after Config.HeldWarnAfter the
// runner logs it and tells HeldObservers.
//
// # Outages
//
// Errors that mean a server could not be reached (retry.IsConnection:
// SQLSTATE classes 08 and 53, 57P01–57P03, 25006 (a read-only server: a
// standby not yet promoted), network errors, Kafka brokers or
// coordinators unavailable) are outages, not verdicts on a message. The
// runner waits them out with backoff and jitter wherever it meets them — the
// topic check at start, joining the group, reading positions, a transaction
// (also when the connection dies under the handler), releasing parked
// messages — and logs each outage once when it starts and once when it ends,
// with its duration (OutageObserver). A transaction
// cut by an outage runs again without spending the message's retries; a
// commit whose outcome is unknown is settled by the claims (what committed
// comes back as duplicates). Config.MaxOutage bounds the wait: past it Run
// returns a *retry.OutageError.
//
// # Memory
//
// Each partition fetches ahead of its handler at most its share of
// Config.MaxBufferedBytes (the budget divided by the partitions assigned),
// and always at least one message. A fetch's records are held decoded until
// the last of them is handed on, and small messages decode to several times
// their size on the wire, so fetches are sized by what they decode to: the
// first asks for an eighth of the share (16 KiB to 1 MiB), each later one
// for what decodes to half the share at the ratio the previous fetch
// showed (16 KiB to 4 MiB; Kafka returns a larger record batch whole). The
// messages held stay below 1.5 × MaxBufferedBytes + assigned partitions ×
// (64 KiB + 3 × the largest record batch). The ratio is estimated from the
// records' uncompressed sizes: on a compressed topic a fetch decodes to up
// to the compression ratio times more.
//
// # Order, batching, rebalances
//
// Partitions added to the topic are picked up within
// PartitionWatchIntervalDefault. Messages of one partition are handled in
// offset order; partitions run in
// parallel, at most Config.MaxPartitions at once. By default every message
// of a partition already fetched, up to Config.BatchSize (500), shares one
// transaction (their claims in one statement) and no batch waits to fill
// (Config.BatchLinger 0); BatchSize 1 gives one transaction per message, and
// Config.BatchHandler may apply a batch with set-based SQL. A failing handler does not undo or block the others'
// effects: the batch is rolled back and run again split around the failure
// (a per-message handler names the failing message; a batch handler's batch
// is halved until the failure is isolated). When a generation ends, work for
// its partitions stops: a transaction in flight is rolled back, or finished
// if it was already committing, and no offset of an uncommitted transaction
// is ever committed.
//
// # Transactions
//
// Each transaction of a partition sends BEGIN and its claims (with the
// position) in one round trip, then runs the handler's statements, then
// COMMIT: three round trips per transaction, one transaction per batch
// (per message with BatchSize 1). A handler must not end its transaction
// itself: one that does (tx.Rollback, a ROLLBACK statement) and returns nil
// fails with an error wrapping pgx.ErrTxClosed.
//
// A transaction is bounded on both ends, so that a connection that goes
// silent (a NAT or firewall that forgot the flow) never holds a partition
// for long: the handler calls get Config.HandlerTimeout; the runner gives
// the transaction up after HandlerTimeout plus 10s (the COMMIT after 10s)
// and runs it again on a new connection; and PostgreSQL ends it once idle
// that long (SET LOCAL idle_in_transaction_session_timeout, sent with
// BEGIN), releasing the locks of its claims. A claim that waits 5s for
// another session's lock logs that session at WARN, and the TxEndEvent
// says how long it waited. See docs/network-faults.md.
//
// # Failures
//
// Handler errors roll back the effect together with the claim: nothing is
// marked done before it is done. Panics become *idemkit.PanicError carrying the
// stack. PostgreSQL serialization failures and deadlocks rerun the
// transaction (Config.TxRetries). Other errors go through Config.Retry (see
// package retry): transient errors are retried with exponential backoff and
// jitter, permanent ones are not. A message that fails for good goes to
// Config.OnFailure (for example a dlq.Writer), and only once that accepted it
// does the position move past it; without OnFailure Run stops with a
// *MessageError and the message is not skipped.
//
// Config.FailureMode chooses what a failing message does to those behind it:
// Blocking (the default) retries in place and the partition waits;
// NonBlocking parks it in PostgreSQL with every later message of its key and
// lets other keys flow, keeping order per key (see NonBlocking). Messages
// parked by a NonBlocking run are released whatever the mode of the runner
// that finds them: switching to Blocking strands nothing. ListParked shows
// what is parked (each key's head first, with its failures); RetryParked
// makes heads due at once, after the dependency healed, instead of at the
// time ParkedRetry gave them: the runner still releases each key in order,
// through dedup and the handler (`idemkit consumer parked list|retry`).
//
// # Dedup horizon
//
// With Config.Retention set, the runner purges dedup records older than
// Retention (by PostgreSQL's clock, against the time each record was
// written), so a message can be deduplicated only while its record lives.
// A message's record is written when it is first processed, which is never
// before its Kafka record timestamp; so a message whose timestamp is younger
// than Retention still has its record, if it ever had one. The horizon is
// Retention minus Config.HorizonMargin (by default a tenth of Retention, at
// most 5 minutes), the margin covering the skew between the clocks of the
// producers (or brokers, for LogAppendTime topics), of the runner and of
// PostgreSQL.
//
// A message older than the horizon, by the runner's clock, whose claim comes
// back new cannot be told from one applied before and purged since. By
// default (HorizonFail) it is not applied: its claim is rolled back, and it
// goes without retries to Config.OnFailure (or stops the runner) with a
// *HorizonError matching ErrBeyondHorizon and retry.IsPermanent; with
// HorizonApply it is applied as new. Either way its OutcomeEvent carries
// the *HorizonError (the idemotel module exports idemkit_consumer_beyond_horizon_total). An old
// message whose claim finds its record is a duplicate as always; messages
// without a timestamp, messages released from parking (NonBlocking; they
// were checked when first handled), and every message of a runner without
// Retention are not checked. A consumer that falls further behind than the
// horizon (down longer than Retention, or a new group reading a topic from
// its start) sends what it reads from beyond the horizon to OnFailure:
// raise Retention, or choose HorizonApply where applying twice is harmless.
//
// With the daily dedup layout (dedup.Store.EnableDaily), the runner also
// keeps the partitions: at start, every PurgeInterval and whenever a claim
// found none for its day, it runs dedup.Store.MaintainPartitions (created
// ahead, dropped past the days kept). A message whose UUIDv7 ID is dated on
// a dropped day cannot be claimed at all: it goes to OnFailure with a
// *HorizonError whose Cause is dedup.ErrPartitionDropped, whatever
// OnBeyondHorizon says. One dated on a day without a partition yet (a
// producer's clock far ahead) fails with dedup.ErrNoPartition and is
// retried under the retry policy. A batch holding such a message is split
// until it stands alone, so the others commit.
//
// # Observing it
//
// The package depends on no metrics or tracing library; it offers seams that
// adapters (the module github.com/idemkit/idemkit/idemotel) and your own code
// use. Config.Middleware and Config.BatchMiddleware wrap the handler inside
// the transaction. Config.Observers take the runner's events, each through
// the interfaces it implements (several observers coexist): a TxObserver's
// TxStart runs before each transaction (one message, or a batch) with the
// handler attempt, and the context it returns is the one the claim, the
// handlers and every later event of that transaction get, so a span started
// there covers claim, handler and commit; its TxEnd reports the
// transaction's end with its outcomes or error and its duration. An
// OutcomeObserver sees each message's fate, a RetryObserver each retry in
// place with the error's class and the delay, and the other interfaces the
// runner's life (rebalances, assignments, offset commits, outages, purges).
// Runner.Partitions tells, from any goroutine, each held partition's
// position, lag behind the last stable offset and parked messages: gauges
// read it.
//
// # Shutdown
//
// Run returns after its context is cancelled, and only when every goroutine
// it started has exited: fetching stops, in-flight transactions end, the
// committer commits the last positions, and the member leaves the group.
package consumer
