// Package dlq keeps messages that cannot succeed and replays them safely.
//
// # Dead-lettering
//
// A Writer's OnFailure is a consumer.FailureFunc. The consumer calls it for a
// message whose error is permanent (see package retry) or whose retries are
// used up, or that has no usable message ID (consumer.ErrMissingID); it
// publishes the original key, value and headers to the dead-letter topic
// (default "<topic>.dlq") with headers that record the origin (topic,
// partition, offset, the topic's incarnation, the record timestamp, consumer group, dedup name,
// message ID — empty for ErrMissingID), the last error's text and class, the
// attempt count, the first and last failure times, the replay round and the
// whole failure history as JSON (see the Header… constants). The write waits
// for all in-sync replicas. Only after it succeeded does the consumer record
// the partition's position past the message: a message is never lost between
// the two. While the dead-letter topic is unavailable (not created: the
// Writer never creates topics, CreateTopic does), OnFailure keeps retrying
// with backoff and the partition waits; other partitions keep flowing. While
// Kafka cannot be reached at all, OnFailure waits the outage out, logging it
// once when it starts and once with its duration when it ends; past
// WriterConfig.MaxOutage (default: no bound) it returns a *retry.OutageError.
//
// # Letters too large for their topic
//
// A dead letter is its message plus its headers, so it can exceed the
// dead-letter topic's max.message.bytes (read from the broker) when the
// message fits its own topic. The writer then cuts the failure history to
// its first and last rounds (the last error's text is in HeaderError only,
// never twice); if that is not enough and WriterConfig.Pool is set, it keeps
// the original value in PostgreSQL (keyed by consumer,
// origin and the value's SHA-256) and writes the letter with the original
// key and headers, every dead-letter header, an empty value and a
// reference (HeaderValueStored). The Reprocessor loads the value back
// (LoadValue does it for other readers) and checks its size and hash: a
// replay gets the original bytes exactly. The value is stored before the
// letter is written, and both before the position moves: a crash leaves at
// worst a stored value without its letter. Without Pool, or when the key
// and headers alone are too large, the write fails with a *TooLargeError,
// which is retried under WriterConfig.Retry (the partition waits, each
// attempt logged at ERROR) until the topic takes the letter; it never stops
// the consumer as a permanent error. Every failed write is logged at ERROR
// with the message's coordinates and reported to WriterConfig.WriteFailed.
//
// # Dead-letter topics by error
//
// WriterConfig.Routes send failures to dead-letter topics by error, as a
// destination resolver does: the first Route whose Match reports true for
// the message and its error chooses the topic (RouteErrors matches with
// errors.Is), e.g. validation errors to "orders.invalid"; the rest go to
// Topic. Writer.Topics lists every destination. A dead letter keeps its
// origin, round and history wherever it goes: a Redrive that fails again
// goes where the consumer would send it (ReprocessorConfig.Destination:
// Writer.Route), a republished message that fails again goes through the
// consumer's Writer, and replay records are keyed by origin and round, not
// by topic. List several destinations together (ListConfig.Topics) to group
// a message's rounds; replay each destination with its own Reprocessor.
//
// A crash after the dead-letter write and before the position commit makes
// the consumer fail the message again after restart and dead-letter it a
// second time. Both copies carry the same origin and replay round, and the
// reprocessor treats them as one dead letter.
//
// # Identity of a dead letter
//
// A dead letter is identified by its origin — topic, incarnation, partition,
// offset — and its replay round. The incarnation (consumer.Message's) tells
// apart two topics of the same name, one deleted and created again, whose
// offsets both start at 0: their dead letters never collide. A republished
// message that fails again keeps the origin of its first dead letter (see
// Replaying).
//
// # Replaying
//
// A Reprocessor reads a dead-letter topic from its start to the end it has
// when Run starts (no consumer group; reading moves no offset) and, for each
// dead letter its Filter selects:
//
//   - if a replay record for the dead letter (origin and round) exists:
//     AlreadyReplayed, nothing done — replaying twice is a no-op;
//   - if the dedup store already holds the message ID under the original
//     consumer name: AlreadyApplied, recorded, nothing re-run;
//   - if its replay rounds are used up (its round is ReplayLimit): Exhausted,
//     recorded, nothing re-run;
//   - Redrive: one transaction inserts the replay record, claims the original
//     message ID under the original consumer name (the consumer's own dedup
//     scope), runs the Handler and commits — the effect, the claim and the
//     record of who replayed it and when commit together, so a crash in the
//     middle of a replay and a rerun still apply each effect once;
//   - Republish: the original message goes back to its origin topic with its
//     message ID and its lineage (HeaderLineage: origin, consumer, history),
//     and the consumer's dedup absorbs any repeat.
//
// A dead letter whose handler fails again gets its history extended and its
// round increased, in both modes: in Redrive mode the reprocessor writes it
// back to the dead-letter topic itself; in Republish mode the consumer fails
// the republished message and its Writer, reading the lineage, writes the
// next round. A dead letter gets ReplayLimit rounds: in Redrive mode a
// failure in the last round exhausts it at once (recorded as Exhausted, not
// written back); in Republish mode the next run exhausts the dead letter that round
// produced. Either way the loop ends.
//
// # Dead letters without a message ID
//
// A message the consumer found no usable ID in (consumer.ErrMissingID) is
// dead-lettered with an empty message ID. Such a dead letter is one dead
// letter's outcome, never an error that stops a run: it cannot be claimed in
// the consumer's dedup scope, so Redrive reports it as NoMessageID (with
// ErrNoMessageID) and leaves it alone, unrecorded; Republish writes it back
// (RepublishedNoID) and the consumer applies its MissingID policy again — with
// MissingIDUseCoordinates it is then processed under the ID of its new
// coordinates. Without an ID nothing deduplicates it: a crash between the
// republish and its record may republish it twice, and each copy gets its
// own coordinates.
//
// # The dedup horizon
//
// A dead letter may be replayed long after its message was first sent, and
// the dedup store forgets: records older than the consumers' retention are
// purged. A message applied once, whose record was purged since, would be
// applied again. With ReprocessorConfig.Retention set (the consumers'
// consumer.Config.Retention), both modes apply the consumer's rule: a dead
// letter whose message ID the store does not hold and whose original
// message (Origin.Time, the record timestamp the dead letter keeps) is
// older than the horizon is BeyondHorizon, with a *consumer.HorizonError,
// and left alone, unrecorded; the run goes on. An operator who knows that
// applying it again is right sets OnBeyondHorizon to consumer.HorizonApply
// (`idemkit dlq replay -apply-beyond-horizon`) and runs again.
//
// With the daily dedup layout (dedup.Store.EnableDaily), a dead letter
// whose UUIDv7 ID is dated on a day the layout's retention dropped cannot
// be claimed any more, whatever OnBeyondHorizon says: Redrive reports it as
// BeyondHorizon (with dedup.ErrPartitionDropped), records it and leaves it
// alone; the run goes on.
//
// # State
//
// List reads a dead-letter topic and the replay records of its messages and
// gives each dead letter its State — unresolved (no replay decided it),
// replayed (republished; its consumer decides), applied, exhausted (its
// replay rounds used up), superseded (it failed again,
// and a later round stands for its message) or beyond-horizon — grouped
// per origin message, whose state is that of its latest round. The copies
// and rounds of one message count once: Listing.Count says how many
// messages wait for a decision (`idemkit dlq list`, `idemkit status
// -max-dlq`, and the idemotel module's idemkit_dlq_messages gauge use it).
//
// # Outages
//
// Run waits out PostgreSQL and Kafka outages (connection-class errors, see
// retry.IsConnection) wherever they happen: it backs off, logs each outage
// once when it starts and once with its duration when it ends, and goes on
// where it was — reading the dead-letter topic from the message after the
// last one handled, repeating the step (a query, a write, a redrive
// transaction) that failed. An outage is never a dead letter failing again:
// a redrive transaction whose connection is lost under the handler is run
// again without spending an attempt or a round. Past MaxOutage (default: no
// bound) Run returns a *retry.OutageError.
//
// A dead letter that cannot be written back (its next round, or its
// republished copy) is that dead letter's WriteFailed, recorded with the
// error, and the run goes on; the next run tries it again. A letter whose
// stored value is missing is ValueNotFound, left alone.
//
// DryRun reports what would happen and writes nothing. It decides each dead
// letter as the real run would at that point, remembering its own earlier
// decisions where the real run would read what it wrote: the second copy of
// a dead letter is AlreadyReplayed, and in Redrive mode a message ID
// already decided for replay is AlreadyApplied. Rate bounds the pace;
// Progress reports each decision. Run's Summary counts dead-letter records
// (Records: the same message dead-lettered twice counts twice) and distinct
// origin messages (Messages).
//
// The tables (replay records, stored values) are created by package
// migrate.
package dlq
