// Package kread reads one partition of a Kafka topic the way Kafka's Java
// consumer does with isolation.level=read_committed: it returns the records
// of committed transactions and the records written outside transactions,
// and never a transaction marker (control record) nor a record of an
// aborted transaction.
//
// kafka-go's Reader cannot be used on topics written by transactional
// producers (Java producers with transactional.id, Kafka Streams with
// exactly-once, Debezium, ...): it returns the markers as messages and, even
// with IsolationLevel ReadCommitted, the records of aborted transactions
// (segmentio/kafka-go#1332). kread sends kafka-go's protocol-level Fetch
// request (isolation level read_committed) through a kafka.Client's
// transport, so it goes to the partition leader with the client's TLS and
// SASL settings, and keeps what kafka.Client.Fetch drops: the aborted
// transactions, the last stable offset, the control batches and each
// batch's attributes and producer ID.
//
// # What is returned
//
// A record is returned when it is at or after the reader's offset, before
// the partition's last stable offset (the first offset of the oldest
// transaction still open, or the high watermark when none is open), and
// neither in a control batch nor in an aborted transactional batch. A
// transactional batch is aborted when the response lists an aborted
// transaction of the batch's producer that starts at or before the batch
// and the abort marker of that producer has not been met since (Kafka's
// CompletedFetch: abortedProducerIds and the aborted transactions ordered by
// first offset). Records come in offset order with Topic, Partition, Offset,
// HighWaterMark, Key, Value, Headers and Time set; keys and values are
// copies the caller owns.
//
// A transaction left open holds the reader at the last stable offset:
// records after the transaction's first record, including committed and
// non-transactional ones, are returned only once it commits (its records
// then come too) or aborts (they are skipped). This is Kafka's
// read_committed contract, and the reason a hung producer stalls every
// read_committed consumer of the partition until transaction.timeout.ms.
//
// # Positions
//
// Fetch.Next is the offset after everything the fetch covered, markers and
// aborted records included: a consumer that stores Next as its position
// reaches the log end (lag 0) even when the partition ends with a marker.
// Next never passes the last stable offset. When compaction removed the
// last records of a batch, Kafka keeps the batch's last offset but kafka-go
// does not expose it; kread then finds the batch's end with a few
// one-batch fetches (a binary search) so that the reader never fetches the
// same batch for ever.
//
// Config.ReadUncommitted reads like isolation.level=read_uncommitted:
// records of aborted and open transactions are returned too (only markers
// are left out). It is unsafe for anything that must not act on data its
// producer rolled back; it exists for tools that inspect a topic as stored.
//
// # Errors
//
// Errors of the connection to Kafka (dial, network, a closed connection, a
// request timeout) are returned unchanged, so that callers can classify
// them (retry.IsConnection) and wait them out. kafka-go's transport reports
// a cluster it never reached as "topic not found" when asked to route a
// Fetch; kread returns the connection error behind it instead, and turns
// the transport's other routing refusals into kafka.UnknownTopicOrPartition
// (the metadata has no such partition) or kafka.LeaderNotAvailable (no
// leader yet, or metadata older than the partition), wrapped with %w.
// Errors Kafka answers are kafka.Error values wrapped with %w; an offset
// outside the
// partition's log is an *OffsetOutOfRangeError (errors.Is
// kafka.OffsetOutOfRange), after which callers list the partition's offsets
// and call SetOffset.
//
// A Reader is not safe for concurrent use; it starts no goroutine and holds
// no connection of its own (the client's transport pools them).
package kread
