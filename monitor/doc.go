// Package monitor reads the state idemkit keeps in PostgreSQL and Kafka
// into one Snapshot: each consumer's position per partition against the
// partition's log end (its lag), its parked messages and its oldest
// processed-message record; the outbox backlog and its dead messages;
// the HTTP idempotency records stuck in flight; the days of daily dedup
// partitions ahead. It is for dashboards, alerts and health checks that
// must hold whichever process runs the consumers and relays.
//
// Example collects one Snapshot and prints each consumer's lag and the
// outbox backlog.
//
// # Contract
//
// It reads the tables and the topics, not a running process: what it
// reports holds whichever process runs the consumers and relays, and
// whether any runs at all. A consumer that stopped still shows its lag
// growing; a relay that stopped still shows its backlog ageing.
// `idemkit status` prints a Snapshot; idemotel's Monitor collects one on a
// schedule and exports it as gauges.
//
// New validates the Config (Kafka.Brokers is required; errors wrap
// ErrInvalidConfig) and does not connect. Collect reads every part even
// when another fails: its error joins the failures, and the Snapshot holds
// every part that was read. A table that does not exist is listed in
// Snapshot.Missing, not an error; what else could not be read is in
// Snapshot.Notes, and a value that is unknown (a lag whose log end could
// not be read) is nil.
//
// Config defaults: Tables the zero value (schema "public", every default
// name); OldestRecordTimeout OldestRecordTimeoutDefault, past which an
// oldest record's age is reported unknown; StuckInterval
// StuckIntervalDefault, within which Collect reports the last count of
// stuck records again instead of scanning the table. A Monitor is safe for
// concurrent use; Close releases its idle Kafka connections.
package monitor
