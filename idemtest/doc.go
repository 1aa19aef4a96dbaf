// Package idemtest is idemkit's test kit: it lets your `go test` check, on
// your own PostgreSQL (and Kafka where a test needs a topic), that your
// consumer handlers, outbox writes and HTTP endpoints are idempotent, the
// way idemkit's own tests check idemkit. Like River's rivertest, it is
// imported by your tests; it needs nothing beyond pgx, kafka-go and the
// standard library.
//
// # Contract
//
// Consumer handlers run through the production code, not a copy of it:
// NewConsumer builds a consumer.Runner from the consumer.Config you use in
// production and Consumer.Deliver calls consumer.Runner.Deliver, which
// runs the transaction Run runs for a fetched batch — the message ID taken
// from the record as Run takes it, the claim and the partition's position
// in the statement that begins the transaction, your Middleware and
// handler for the new claims only, the hooks, COMMIT — without a broker.
// What it does not do is Run's deciding: nothing is retried, parked or
// dead-lettered, and errors come back to the test.
//
// The Require helpers take a testing.TB and an Effect: a function that
// reads your business effect as committed (a row count, a balance, a
// counter). They report every fault with tb.Errorf, naming the delivery and
// what was seen, and stop the test with tb.Fatalf only when the deliveries
// cannot go on. Each helper wants a message whose ID is new to the
// consumer, and an Effect that the handler changes: one that does not
// change is reported, since the test would prove nothing.
//
//   - RequireIdempotent: a first delivery is Applied and changes the effect;
//     a redelivery at the same offset and a producer retry (the same record
//     at the next offset) are Duplicates and change nothing; the handler
//     ran once.
//   - RequireIdempotentBatch: a batch with the message twice is Applied,
//     Duplicate, the same batch again Duplicate, Duplicate; the effect
//     changes once, the handler ran once for the ID.
//   - RequireRecovers: the delivery crashes at a CrashPoint — the
//     transaction's connection killed (pg_terminate_backend) in the handler
//     or before COMMIT, or the process lost after COMMIT, before its Kafka
//     offset commit — and the redeliveries that follow leave the effect
//     exactly once. A crash before commit rolls the transaction back, so a
//     handler that counts in memory, writes on the pool instead of tx or
//     calls another service is caught here: deliveries that commit cannot
//     see such effects.
//
// Crashes kill a real backend: the pool needs a spare connection, and the
// user in its URL must be allowed to terminate its own backends (it is, by
// default).
//
// Outbox: EnqueuedTx and RequireEnqueuedTx read back what a transaction
// enqueued with outbox.Store.EnqueueTx (its savepoints included, nothing of
// any other transaction); MarkOutbox, EnqueuedSince and
// RequireEnqueuedSince what committed after a mark, such as the events a
// handler run through Consumer.Deliver enqueued.
//
// HTTP: RequireReplay sends a request with an Idempotency-Key twice through
// your http.Handler (idemhttp's middleware inside it) and checks that the
// second answer is a byte-identical replay marked Idempotent-Replayed: true
// and that the effect happened once; CountRuns gives an Effect that counts
// the handler's runs. Only idemhttp's public headers are used, never its
// tables.
//
// Fixtures: NewSchema (CreateSchema without a testing.TB) creates a schema
// with a random name on your database, applies every idemkit migration to
// it, and drops it when the test ends; NewTopic (CreateTopic) does the same
// for a Kafka topic. A test per schema keeps parallel tests apart.
//
// # A test of your handler
//
//	func TestPaymentHandler(t *testing.T) {
//		pool, err := pgxpool.New(t.Context(), os.Getenv("DATABASE_URL"))
//		if err != nil {
//			t.Fatal(err)
//		}
//		t.Cleanup(pool.Close)
//		s := idemtest.NewSchema(t, pool) // idemkit's tables, dropped at the end
//		createTables(t, pool, s.Name)    // your schema
//		store, _ := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: s.Name}})
//		c, err := idemtest.NewConsumer(pool, &consumer.Config{Store: store,
//			Handler: payments.NewHandler(s.Name)})
//		if err != nil {
//			t.Fatal(err)
//		}
//		charged := func(ctx context.Context) (int64, error) { return sumCharges(ctx, pool, s.Name) }
//		idemtest.RequireIdempotent(t.Context(), t, c, paymentMsg("pay-1"), charged)
//		for i, crash := range idemtest.CrashPoints() {
//			idemtest.RequireRecovers(t.Context(), t, c, crash, paymentMsg(fmt.Sprint("pay-crash-", i)), charged)
//		}
//	}
package idemtest
