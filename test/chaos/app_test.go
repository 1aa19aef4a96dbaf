package chaos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/faultplan"
)

// schema holds idemkit's tables and the application's.
const schema = "chaos"

// app is the application under chaos: its handler applies an effect once per
// message ID, checks that each key's messages arrive in sequence, and
// enqueues one outbox message per effect, all in the handler's transaction.
type app struct {
	outTopic string
	outbox   *outbox.Store
	effects  string // quoted tables
	keySeq   string
	breaks   string
}

func newApp(outTopic string) (*app, error) {
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return nil, err
	}
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return &app{outTopic: outTopic, outbox: store, effects: t("effects"), keySeq: t("key_seq"), breaks: t("order_breaks")}, nil
}

// setup migrates idemkit's tables and creates the application's: effects
// (one row per message ID: a second effect of an ID violates the primary key
// and fails the handler), key_seq (the last sequence number applied per key,
// every key starting at -1) and order_breaks (messages that arrived out of
// sequence).
func (a *app) setup(ctx context.Context, pool *pgxpool.Pool, keys []string) error {
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE `+a.effects+` (
			id        text   PRIMARY KEY,
			key       text   NOT NULL,
			seq       int    NOT NULL,
			part      int    NOT NULL,
			off       bigint NOT NULL,
			via       text   NOT NULL,
			applied   bigserial);
		CREATE TABLE `+a.keySeq+` (key text PRIMARY KEY, seq int NOT NULL);
		CREATE TABLE `+a.breaks+` (id text NOT NULL, key text NOT NULL, seq int NOT NULL, last int NOT NULL, via text NOT NULL)`)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+a.keySeq+` (key, seq) SELECT unnest($1::text[]), -1`, keys)
	return err
}

// apply is the handler's work for one message; via names who applied it.
func (a *app) apply(ctx context.Context, tx pgx.Tx, m *consumer.Message, via string) error {
	seq, err := strconv.Atoi(faultplan.Header(m.Message, faultplan.SeqHeader))
	if err != nil {
		return retry.Permanent(fmt.Errorf("message %s: bad %s header: %w", m.ID, faultplan.SeqHeader, err))
	}
	key := string(m.Key)
	if _, err := tx.Exec(ctx, `INSERT INTO `+a.effects+` (id, key, seq, part, off, via) VALUES ($1, $2, $3, $4, $5, $6)`,
		m.ID, key, seq, m.Partition, m.Offset, via); err != nil {
		return fmt.Errorf("effect of %s: %w", m.ID, err)
	}
	tag, err := tx.Exec(ctx, `UPDATE `+a.keySeq+` SET seq = $2 WHERE key = $1 AND seq = $2 - 1`, key, seq)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		// Out of sequence: note it, and carry on from here.
		if _, err := tx.Exec(ctx, `INSERT INTO `+a.breaks+` (id, key, seq, last, via)
			SELECT $1, key, $3, seq, $4 FROM `+a.keySeq+` WHERE key = $2`, m.ID, key, seq, via); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+a.keySeq+` SET seq = $2 WHERE key = $1`, key, seq); err != nil {
			return err
		}
	}
	_, err = a.outbox.EnqueueTx(ctx, tx, outbox.Message{Topic: a.outTopic, Key: m.Key, Value: []byte(m.ID),
		Headers: []kafka.Header{{Key: faultplan.SeqHeader, Value: []byte(strconv.Itoa(seq))}}})
	return err
}

func (a *app) handler(via string) consumer.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error { return a.apply(ctx, tx, m, via) }
}

func (a *app) batchHandler(via string) consumer.BatchHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			if err := a.apply(ctx, tx, m, via); err != nil {
				return err
			}
		}
		return nil
	}
}

// produce sends the plan to topic in batches spread over d, each batch
// acknowledged by the broker before the next; a batch that fails (the broker
// is down) is sent again until it succeeds, so a message may stand twice in
// the topic, never out of order. sent counts the messages acknowledged.
func produce(ctx context.Context, brokers []string, topic string, p *faultplan.Plan, d time.Duration, sent *atomic.Int64) error {
	tr := &kafka.Transport{DialTimeout: 2 * time.Second, MetadataTTL: time.Second}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, Transport: tr,
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000, MaxAttempts: 1,
		WriteTimeout: 5 * time.Second}
	defer w.Close()
	const batch = 50
	tick := time.NewTicker(max(d*batch/time.Duration(len(p.Sends)), time.Millisecond))
	defer tick.Stop()
	for from := 0; from < len(p.Sends); from += batch {
		msgs := p.Sends[from:min(from+batch, len(p.Sends))]
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := w.WriteMessages(wctx, msgs...)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("produce: %d of %d sent: %w", from, len(p.Sends), ctx.Err())
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		sent.Store(int64(from + len(msgs)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// seedDeadLetters writes n dead letters, IDs d-0 … d-(n-1), each of its own
// key, as the consumer that w names would have when it gave up on them
// (dlq.Writer's OnFailure), from an origin topic that no longer exists.
func seedDeadLetters(ctx context.Context, w *dlq.Writer, origin string, n int) error {
	for i := range n {
		msg := &consumer.Message{ID: "d-" + strconv.Itoa(i), Message: kafka.Message{
			Topic: origin, Partition: 0, Offset: int64(i),
			Key: []byte(deadKey(i)), Value: []byte("dead letter " + strconv.Itoa(i)),
			Headers: []kafka.Header{
				{Key: consumer.IDHeaderDefault, Value: []byte("d-" + strconv.Itoa(i))},
				{Key: faultplan.SeqHeader, Value: []byte("0")},
			}}}
		if err := w.OnFailure(ctx, msg, retry.Permanent(errors.New("rejected by a bug fixed since"))); err != nil {
			return err
		}
	}
	return nil
}

func deadKey(i int) string { return "dead-" + strconv.Itoa(i) }

// missing returns the IDs of want that are not keys of got, at most 20.
func missing(want []string, got map[string]bool) []string {
	var out []string
	for _, id := range want {
		if !got[id] {
			out = append(out, id)
			if len(out) == 20 {
				break
			}
		}
	}
	return out
}

// checkEffects fails the test unless every wanted ID has exactly one effect,
// nothing else has one, and no key's messages were applied out of sequence.
func checkEffects(t *testing.T, ctx context.Context, pool *pgxpool.Pool, a *app, want []string) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT id FROM `+a.effects)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string]bool, len(ids))
	for _, id := range ids {
		got[id] = true // the primary key makes each ID appear once
	}
	wanted := make(map[string]bool, len(want))
	for _, id := range want {
		wanted[id] = true
	}
	if lost := missing(want, got); len(lost) > 0 {
		t.Errorf("%d of %d messages have an effect; no effect for (first 20): %v", len(got), len(want), lost)
	}
	if extra := missing(slices.Sorted(maps.Keys(got)), wanted); len(extra) > 0 {
		t.Errorf("effects of IDs never sent (first 20): %v", extra)
	}
	rows, err = pool.Query(ctx, `SELECT id, key, seq, last, via FROM `+a.breaks+` ORDER BY key, seq LIMIT 20`)
	if err != nil {
		t.Fatal(err)
	}
	type orderBreak struct {
		ID, Key   string
		Seq, Last int
		Via       string
	}
	breaks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[orderBreak])
	if err != nil {
		t.Fatal(err)
	}
	if len(breaks) > 0 {
		t.Errorf("messages applied out of their key's sequence (message, key, its seq, the key's last applied seq, runner): %+v", breaks)
	}
}

// checkPublished reads topic and fails the test unless every wanted ID was
// published, and within each key the first copies came in sequence
// (duplicates are allowed: the relay publishes at least once).
func checkPublished(t *testing.T, brokers []string, topic string, want []string) {
	t.Helper()
	msgs := testenv.ReadAll(t, brokers, topic)
	got := map[string]bool{}
	next := map[string]int{}
	dups := 0
	var breaks []string
	for _, m := range msgs {
		id := string(m.Value)
		if got[id] {
			dups++
			continue
		}
		got[id] = true
		key := string(m.Key)
		if seq, _ := strconv.Atoi(faultplan.Header(m, faultplan.SeqHeader)); seq != next[key] && len(breaks) < 20 {
			breaks = append(breaks, fmt.Sprintf("%s: %s has seq %d, want %d", key, id, seq, next[key]))
		}
		next[key]++
	}
	if lost := missing(want, got); len(lost) > 0 {
		t.Errorf("%d of %d outbox messages in %s; not published (first 20): %v", len(got), len(want), topic, lost)
	}
	if len(breaks) > 0 {
		t.Errorf("outbox messages published out of their key's order: %v", breaks)
	}
	t.Logf("outbox topic: %d messages, %d distinct, %d duplicates", len(msgs), len(got), dups)
}
