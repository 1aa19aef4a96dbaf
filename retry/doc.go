// Package retry decides whether and when a failed attempt runs again.
//
// ExamplePolicy_Do retries a call to a provider that times out twice;
// ExamplePermanent and ExamplePolicy_Schedule show an error that is never
// retried and a loop of your own.
//
// A Policy is an exponential backoff — initial
// and maximum interval, multiplier — with jitter (each delay spread uniformly
// over ±RandomizationFactor, from an injectable random source), bounded by
// MaxAttempts and MaxElapsedTime. Every field has a documented default, so
// the zero Policy is usable. Policy.Do retries an operation and honours its
// context; Policy.Schedule gives a fresh Schedule to callers that keep their
// own loop (the consumer, the dead-letter writer). No type of the backoff
// library it is built on (cenkalti/backoff/v4) is part of this API.
//
// Errors are split by Classify (or Policy.Classifier):
//
//   - permanent, never retried: errors wrapped with Permanent (a
//     *PermanentError; backoff/v4's Permanent is recognised too), errors matching
//     ErrInvalid, JSON and number decoding errors, PostgreSQL data and
//     integrity errors (SQLSTATE 22xxx, 23xxx), Kafka errors that are not
//     temporary;
//   - transient, retried under the policy: PostgreSQL serialization failures
//     and deadlocks (40001, 40P01), connection and resource errors (08, 53,
//     57), Kafka temporary errors, and anything unknown — bounded by the
//     attempts, so an unknown error is given up on after a few tries;
//   - stop: the context was cancelled or its deadline passed.
//
// In idemkit a permanent error, or a transient one whose attempts are used
// up, hands the message to the dead-letter path (package dlq): nothing is
// dropped and nothing is retried forever.
package retry
