package txn

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

// deadLetters has a dlq.Writer dead-letter one message of origin per id
// (offsets 0, 1, ...; the message ID in the "message-id" header) into the
// scratch topic, and returns the letters as the Writer wrote them, by
// message ID: key, value and headers, to be written again by a
// transactional producer.
func deadLetters(t *testing.T, origin, scratch string, ids ...string) map[string]kafka.Message {
	t.Helper()
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Topic: scratch, Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now()
	for i, id := range ids {
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Offset: int64(i),
			Key: []byte("k-" + id), Value: []byte("value of " + id),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}}
		merr := &consumer.MessageError{Topic: origin, Offset: int64(i), ID: id, Attempts: 3, Class: retry.ClassTransient,
			FirstFailure: now, LastFailure: now, Err: errors.New("tax service timeout for " + id)}
		if err := w.OnFailure(ctx, m, merr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out := map[string]kafka.Message{}
	for _, m := range testenv.ReadAll(t, testenv.Brokers(t), scratch) {
		d, err := dlq.Parse(m)
		if err != nil {
			t.Fatal(err)
		}
		out[d.MessageID] = m
	}
	if len(out) != len(ids) {
		t.Fatalf("the writer wrote %d letters, want %d", len(out), len(ids))
	}
	return out
}

// sendLetters queues the letters of ids on topic's partition, headers and
// all, as the Writer wrote them.
func sendLetters(pr *txproducer.Producer, letters map[string]kafka.Message, topic string, partition int, ids ...string) {
	for _, id := range ids {
		l := letters[id]
		pr.SendHeaders(topic, partition, l.Key, l.Value, l.Headers)
	}
}

// produceLetters writes the letters of ids to topic's partition outside any
// transaction and returns their offsets.
func produceLetters(t *testing.T, letters map[string]kafka.Message, topic string, partition int, ids ...string) []int64 {
	t.Helper()
	recs := make([]kafka.Record, len(ids))
	for i, id := range ids {
		l := letters[id]
		recs[i] = kafka.Record{Key: kafka.NewBytes(l.Key), Value: kafka.NewBytes(l.Value), Headers: l.Headers}
	}
	base := testenv.Produce(t, topic, partition, recs...)
	out := make([]int64, len(ids))
	for i := range ids {
		out[i] = base + int64(i)
	}
	return out
}

// replayRecords returns the replay records of schema: message ID → outcome.
func replayRecords(t *testing.T, c *consumerDB) map[string]string {
	t.Helper()
	rows, err := c.db.Pool.Query(context.Background(), `SELECT message_id, outcome FROM `+
		c.db.Table(migrate.DLQReplaysDefault))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var id, outcome string
	if _, err := pgx.ForEachRow(rows, []any{&id, &outcome}, func() error {
		if _, dup := out[id]; dup {
			return errors.New("two replay records for " + id)
		}
		out[id] = outcome
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func idsOf(rs []rec) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	slices.Sort(out)
	return out
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestDeadLettersWrittenTransactionally: a dead-letter topic whose letters
// (headers as a dlq.Writer writes them) were written by transactional
// producers, in committed, aborted and interleaved transactions, with
// non-transactional letters between and a transaction left open at the end:
// dlq.Scan, the Reprocessor in Redrive and Republish mode, and `idemkit dlq
// list/replay` see the committed letters only, once each; no aborted letter
// is replayed; a replay record is written per committed letter; the letter
// of the open transaction is replayed once it commits.
func TestDeadLettersWrittenTransactionally(t *testing.T) {
	t.Parallel()
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 2)
	var committedIDs, abortedIDs []string
	for i := range 8 {
		committedIDs = append(committedIDs, "committed-"+strconv.Itoa(i+1))
	}
	for i := range 7 {
		abortedIDs = append(abortedIDs, "aborted-"+strconv.Itoa(i+1))
	}
	letters := deadLetters(t, origin, testenv.NewTopic(t, 1),
		append(append(slices.Clone(committedIDs), abortedIDs...), "pending-1")...)

	jp := txproducer.Start(t, bootstrap(t))
	a, b, c := jp.Producer("", txproducer.None), jp.Producer("", txproducer.Lz4), jp.Producer("", txproducer.None)
	var committed want
	// Partition 0: committed, aborted, non-transactional, then a's
	// committing and b's aborting transactions interleaved batch by batch.
	a.Begin()
	sendLetters(a, letters, dead, 0, "committed-1", "committed-2")
	committed.add(0, a.Commit(), "committed-1", "committed-2")
	a.Begin()
	sendLetters(a, letters, dead, 0, "aborted-1", "aborted-2")
	a.Abort()
	committed.add(0, produceLetters(t, letters, dead, 0, "committed-3"), "committed-3")
	a.Begin()
	b.Begin()
	sendLetters(a, letters, dead, 0, "committed-4")
	committed.add(0, a.Flush(), "committed-4")
	sendLetters(b, letters, dead, 0, "aborted-3")
	b.Flush()
	sendLetters(a, letters, dead, 0, "committed-5")
	committed.add(0, a.Flush(), "committed-5")
	sendLetters(b, letters, dead, 0, "aborted-4")
	b.Flush()
	b.Abort()
	a.Commit()
	// Partition 1 starts with an aborted transaction; a transaction over
	// both partitions commits; partition 1 ends with an abort marker.
	b.Begin()
	sendLetters(b, letters, dead, 1, "aborted-5")
	b.Abort()
	a.Begin()
	sendLetters(a, letters, dead, 1, "committed-6")
	sendLetters(a, letters, dead, 0, "committed-7")
	off := a.Commit()
	committed.add(1, off[:1], "committed-6")
	committed.add(0, off[1:], "committed-7")
	committed.add(1, produceLetters(t, letters, dead, 1, "committed-8"), "committed-8")
	b.Begin()
	sendLetters(b, letters, dead, 1, "aborted-6", "aborted-7")
	b.Abort()
	stableBounds(t, dead, 1)
	// Partition 0 ends with a transaction left open: scans end before it.
	c.Begin()
	sendLetters(c, letters, dead, 0, "pending-1")
	pending := c.Flush()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	brokers := testenv.Brokers(t)
	var scanned []kafka.Message
	if err := dlq.Scan(ctx, kafkaconn.Config{Brokers: brokers}, dead, func(m kafka.Message) error {
		if _, err := dlq.Parse(m); err != nil {
			return err
		}
		scanned = append(scanned, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	equalRecs(t, "dlq.Scan", recsOf(t, scanned), committed.sorted())

	// replay runs a Reprocessor and returns its summary and the letters it
	// reported, as records of the dead-letter topic.
	replay := func(pool *pgxpool.Pool, cfg *dlq.ReprocessorConfig) (dlq.Summary, []rec) {
		t.Helper()
		var seen []kafka.Message
		cfg.Kafka, cfg.Topic = kafkaconn.Config{Brokers: brokers}, dead
		cfg.Progress = func(it dlq.Item) { seen = append(seen, it.Raw) }
		rp, err := dlq.NewReprocessor(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rp.Close()
		sum, err := rp.Run(ctx)
		if err != nil {
			t.Fatalf("reprocessor: %v (summary %v)", err, sum)
		}
		return sum, recsOf(t, seen)
	}
	n := len(committedIDs)

	t.Run("redrive", func(t *testing.T) {
		db := newConsumerDB(t)
		cfg := func() *dlq.ReprocessorConfig {
			return &dlq.ReprocessorConfig{Mode: dlq.Redrive, Tables: migrate.Tables{Schema: db.db.Schema},
				Handler: consumer.HandlerFunc(db.apply)}
		}
		sum, seen := replay(db.db.Pool, cfg())
		if !maps.Equal(sum.Records, dlq.Counts{dlq.Applied: n}) {
			t.Fatalf("redrive: %v, want %d applied", sum, n)
		}
		equalRecs(t, "letters redriven", seen, committed.sorted())
		if got := idsOf(db.applied(t)); !slices.Equal(got, committedIDs) {
			t.Fatalf("applied %v, want %v", got, committedIDs)
		}
		records := replayRecords(t, db)
		if got := sortedKeys(records); !slices.Equal(got, committedIDs) {
			t.Fatalf("replay records for %v, want %v", got, committedIDs)
		}
		for id, outcome := range records {
			if outcome != string(dlq.Applied) {
				t.Fatalf("replay record of %s: outcome %q, want %q", id, outcome, dlq.Applied)
			}
		}
		if sum, _ := replay(db.db.Pool, cfg()); !maps.Equal(sum.Records, dlq.Counts{dlq.AlreadyReplayed: n}) {
			t.Fatalf("second redrive: %v, want %d already-replayed", sum, n)
		}
	})

	t.Run("republish", func(t *testing.T) {
		db := newConsumerDB(t)
		sum, seen := replay(db.db.Pool, &dlq.ReprocessorConfig{Mode: dlq.Republish,
			Tables: migrate.Tables{Schema: db.db.Schema}})
		if !maps.Equal(sum.Records, dlq.Counts{dlq.Republished: n}) {
			t.Fatalf("republish: %v, want %d republished", sum, n)
		}
		equalRecs(t, "letters republished", seen, committed.sorted())
		republished := testenv.ReadAll(t, brokers, origin)
		if got := idsOf(recsOf(t, republished)); !slices.Equal(got, committedIDs) {
			t.Fatalf("republished to %s: %v, want %v", origin, got, committedIDs)
		}
		for _, m := range republished {
			if !slices.ContainsFunc(m.Headers, func(h kafka.Header) bool { return h.Key == dlq.HeaderLineage }) {
				t.Fatalf("republished %s without its lineage", idOf(m))
			}
		}
		records := replayRecords(t, db)
		if got := sortedKeys(records); !slices.Equal(got, committedIDs) {
			t.Fatalf("replay records for %v, want %v", got, committedIDs)
		}
	})

	t.Run("cli", func(t *testing.T) {
		idemkit := idemkitCLI(t)
		out, code := idemkit("dlq", "list", "-topic", dead)
		if code != 0 || !strings.Contains(out, strconv.Itoa(n)+" dead letter(s) of "+strconv.Itoa(n)+
			" origin message(s) shown of "+strconv.Itoa(n)+" record(s) in "+dead) ||
			strings.Contains(out, "aborted-") || strings.Contains(out, "pending-") {
			t.Fatalf("dlq list: exit %d\n%s", code, out)
		}
		for _, id := range committedIDs {
			if strings.Count(out, " "+id+" ") != 1 {
				t.Fatalf("dlq list shows %s %d times, want once:\n%s", id, strings.Count(out, " "+id+" "), out)
			}
		}
		db := newConsumerDB(t)
		cliReplay := func(args ...string) string {
			t.Helper()
			out, code := idemkit(append([]string{"dlq", "replay", "-topic", dead, "-schema", db.db.Schema}, args...)...)
			if code != 0 || strings.Contains(out, "aborted-") || strings.Contains(out, "pending-") {
				t.Fatalf("dlq replay %v: exit %d\n%s", args, code, out)
			}
			return out
		}
		if out := cliReplay("-dry-run"); !strings.Contains(out, "dry run, nothing changed: "+strconv.Itoa(n)+" would-replay\n") {
			t.Fatalf("dlq replay -dry-run:\n%s", out)
		}
		before := len(testenv.ReadAll(t, brokers, origin))
		out = cliReplay()
		lines := 0
		for l := range strings.Lines(out) {
			if strings.HasPrefix(l, string(dlq.Republished)+" ") {
				lines++
			}
		}
		if !strings.HasSuffix(out, "replayed: "+strconv.Itoa(n)+" republished\nper origin message ("+strconv.Itoa(n)+"): "+
			strconv.Itoa(n)+" republished\n") || lines != n {
			t.Fatalf("dlq replay:\n%s", out)
		}
		if after := len(testenv.ReadAll(t, brokers, origin)); after-before != n {
			t.Fatalf("dlq replay wrote %d messages to %s, want %d", after-before, origin, n)
		}
		if got := sortedKeys(replayRecords(t, db)); !slices.Equal(got, committedIDs) {
			t.Fatalf("replay records for %v, want %v", got, committedIDs)
		}
		if out := cliReplay(); !strings.Contains(out, "replayed: "+strconv.Itoa(n)+" already-replayed\n") {
			t.Fatalf("second dlq replay:\n%s", out)
		}
	})

	// Once the open transaction commits, its letter is replayed too, and
	// only it.
	t.Run("after the commit", func(t *testing.T) {
		c.Commit()
		stableBounds(t, dead, 0)
		db := newConsumerDB(t)
		cfg := func() *dlq.ReprocessorConfig {
			return &dlq.ReprocessorConfig{Mode: dlq.Redrive, Tables: migrate.Tables{Schema: db.db.Schema},
				Handler: consumer.HandlerFunc(db.apply)}
		}
		sum, seen := replay(db.db.Pool, cfg())
		if !maps.Equal(sum.Records, dlq.Counts{dlq.Applied: n + 1}) {
			t.Fatalf("redrive: %v, want %d applied", sum, n+1)
		}
		all := append(slices.Clone(committed), rec{Partition: 0, Offset: pending[0], ID: "pending-1"})
		equalRecs(t, "letters redriven", seen, all.sorted())
	})
}
