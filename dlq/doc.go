// Package dlq parks messages that cannot succeed and replays them safely.
//
// Contract (being built, see the README's package map for status): a message
// whose error is permanent, or whose attempts are exhausted, is written to a
// dead-letter topic (default "<topic>.dlq") with its original key, value and
// headers plus headers recording its origin, error and attempt history. The
// source offset is committed only after that write succeeded, so a message is
// never lost between the two. A reprocessor re-drives dead letters through the
// same idempotent consumer path: dedup makes a replay of an already applied
// message a no-op.
package dlq
