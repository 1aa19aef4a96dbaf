// Package dlq keeps messages that cannot succeed and replays them safely. A
// Writer takes the messages a consumer gives up on and publishes them, with
// their origin and failure history, to a dead-letter topic; a Reprocessor
// replays them later, once the cause is fixed, so that each message's
// effect still happens at most once; List tells what waits for a decision.
//
// ExampleReprocessor replays the dead letters of payments.dlq whose last
// error mentions the tax service, in the consumer's own dedup scope;
// ExampleRouteErrors sends validation failures to a topic of their own and
// lists both topics with each dead letter's state.
//
// # Dead-lettering
//
// A Writer's OnFailure is a consumer.FailureFunc. The consumer calls it for a
// message whose error is permanent (see package retry), whose retries are
// used up, or that has no usable message ID (consumer.ErrMissingID). It
// publishes the original key, value and headers to the dead-letter topic
// (by default the topic plus TopicSuffixDefault, ".dlq"; WriterConfig.Routes
// choose other topics by error, see RouteErrors) with headers recording the
// origin (topic, incarnation, partition, offset, timestamp), the consumer,
// the message ID, the last error and its class, the attempts, the replay
// round and the failure history (the Header… constants). The write waits
// for all in-sync replicas, and only after it succeeded does the consumer
// move the partition's position past the message: a message is never lost
// between the two (a crash in between dead-letters it twice, and the two
// copies count as one dead letter).
//
// The Writer never creates topics (kafkaconn.CreateTopic does): while the
// dead-letter topic is missing or unavailable, OnFailure retries with
// backoff and the partition waits. A letter too large for its topic has its
// history cut and, with WriterConfig.Pool set, its value kept in PostgreSQL
// (HeaderValueStored; the Reprocessor and LoadValue restore it); otherwise
// the write fails with a *TooLargeError, retried under WriterConfig.Retry.
// Outages are waited out; past WriterConfig.MaxOutage (default: no bound)
// OnFailure returns a *retry.OutageError.
//
// # Replaying
//
// A Reprocessor reads a dead-letter topic from its start to the end it has
// when Run starts, without a consumer group, and reports an Action for each
// dead letter, which is identified by its origin and replay round:
//
//   - replayed before: AlreadyReplayed, nothing done (replaying twice is a
//     no-op);
//   - its message ID already in the consumer's dedup store: AlreadyApplied;
//   - Redrive mode: one transaction records the replay, claims the message
//     ID under the original consumer name, runs Handler and commits, so a
//     crash and a rerun still apply the effect once (Applied);
//   - Republish mode: the message goes back to its origin topic with its ID
//     and lineage (HeaderLineage), and the consumer's dedup absorbs repeats.
//
// A dead letter that fails again gets its round increased and its history
// extended (FailedAgain); after ReplayLimit rounds (ReplayLimitDefault) it
// is Exhausted, so the loop ends. A dead letter without a message ID cannot
// be deduplicated: Redrive leaves it alone (NoMessageID, ErrNoMessageID),
// Republish writes it back (RepublishedNoID). With
// ReprocessorConfig.Retention set to the consumers' Retention, a dead letter
// whose message is older than the dedup horizon and whose ID the store does
// not hold is BeyondHorizon, with a *consumer.HorizonError, and left alone
// unless OnBeyondHorizon is consumer.HorizonApply. None of these stops a
// run; outages are waited out up to MaxOutage. DryRun reports what a run
// would do and writes nothing.
//
// List gives each dead letter its State (unresolved, replayed, applied,
// exhausted, superseded, beyond-horizon), grouped per origin message;
// Listing.Count says how many messages wait for a decision.
//
// The tables (replay records, stored values) are created by package
// migrate; without them Reprocessor.Run returns an error wrapping
// ErrNotMigrated.
//
// The design (oversized letters, routing, identity, rounds, messages
// without an ID, the dedup horizon, states, outages, dry runs) is explained
// in docs/design/dlq.md in the repository.
package dlq
