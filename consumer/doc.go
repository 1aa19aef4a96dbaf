// Package consumer runs a handler over a Kafka consumer group so that each
// message's business effect happens once.
//
// Contract: for each message the runner begins a pgx transaction, claims the
// message ID in the dedup store, runs the handler in that same transaction only
// when the claim is new, commits, and only then commits the Kafka offset. A
// redelivered message finds its ID already claimed and is acknowledged without
// running the handler again. The guarantee holds at the PostgreSQL boundary:
// effects outside the transaction (e-mails, calls to other services) need the
// outbox.
package consumer
