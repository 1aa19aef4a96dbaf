// Package consumer runs a handler over a Kafka consumer group so that each
// message's business effect happens once.
//
// # Contract
//
// For each message the runner begins a pgx transaction, claims the message
// ID in the dedup store and records the partition's next offset (one
// statement), runs the handler in that same transaction only when the claim
// is new, commits, and only then lets the Kafka offset be committed. A
// redelivered message finds its ID claimed and is acknowledged (Outcome
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
// duplicates, replays, positions lost). Kafka offsets are still committed,
// synchronously, by one committer per generation that sends the newest
// committed position of every partition in one request — never an offset
// whose transaction did not commit — so lag tooling keeps working. A failed
// offset commit is logged and ends the generation.
//
// # Order, batching, rebalances
//
// Messages of one partition are handled in offset order; partitions run in
// parallel, at most Config.MaxPartitions at once. With Config.BatchSize > 1,
// up to that many messages of one partition share one transaction (their
// claims in one statement) and Config.BatchHandler may apply them with
// set-based SQL. A failing handler does not undo or block the others'
// effects: the batch is rolled back and run again split around the failure
// (a per-message handler names the failing message; a batch handler's batch
// is halved until the failure is isolated). When a generation ends, work for
// its partitions stops: a transaction in flight is rolled back, or finished
// if it was already committing, and no offset of an uncommitted transaction
// is ever committed.
//
// # Failures
//
// Handler errors roll back the effect together with the claim: nothing is
// marked done before it is done. Panics become *PanicError carrying the
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
// lets other keys flow, keeping order per key (see NonBlocking).
//
// # Shutdown
//
// Run returns after its context is cancelled, and only when every goroutine
// it started has exited: fetching stops, in-flight transactions end, the
// committer commits the last positions, and the member leaves the group.
package consumer
