// Package retry decides whether and when a failed attempt runs again.
//
// Contract (being built, see the README's package map for status): a policy on
// cenkalti/backoff/v4, exponential with jitter, bounded by attempts and by
// elapsed time, honouring context cancellation. Errors are split into
// transient (retried: Postgres serialization failures and deadlocks, lost
// connections, Kafka temporary errors) and permanent (never retried: wrap an
// error with Permanent, compatible with backoff.Permanent, or classify it with
// a user function). A permanent error or exhausted attempts hand the message
// to the dead-letter path; nothing is dropped.
package retry
