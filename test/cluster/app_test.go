package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/faultplan"
)

// app is the application under test. Its handler counts the effects of each
// message ID (runs: a second effect of an ID is recorded, not refused, so
// that it shows in the checks) and checks that each key's messages arrive in
// sequence, in the handler's transaction.
type app struct {
	db      *testenv.DB
	effects string // quoted tables
	keySeq  string
	breaks  string
	// gate, while set, holds every handler until it is closed (pause).
	gate atomic.Pointer[chan struct{}]
}

// pause holds the handlers until the function it returns is called (once
// or more).
func (a *app) pause() (resume func()) {
	g := make(chan struct{})
	a.gate.Store(&g)
	return sync.OnceFunc(func() {
		a.gate.Store(nil)
		close(g)
	})
}

// keyName is the name of key k of a source ("o": the outbox, "p": the
// producer).
func keyName(source string, k int) string { return fmt.Sprintf("%s-%03d", source, k) }

// newApp makes a fresh schema with idemkit's tables and the application's:
// effects (one row per message ID, with how often its effect ran), key_seq
// (the last sequence number applied per key, every key of both sources
// starting at -1) and order_breaks (messages that arrived out of sequence).
func newApp(t *testing.T, keys int) *app {
	t.Helper()
	a := &app{}
	a.db = testenv.NewDB(t, testenv.Migrate, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		tbl := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
		a.effects, a.keySeq, a.breaks = tbl("effects"), tbl("key_seq"), tbl("order_breaks")
		_, err := pool.Exec(ctx, `CREATE TABLE `+a.effects+` (
				id      text   PRIMARY KEY,
				key     text   NOT NULL,
				seq     int    NOT NULL,
				part    int    NOT NULL,
				off     bigint NOT NULL,
				via     text   NOT NULL,
				runs    int    NOT NULL,
				applied bigserial);
			CREATE TABLE `+a.keySeq+` (key text PRIMARY KEY, seq int NOT NULL);
			CREATE TABLE `+a.breaks+` (id text NOT NULL, key text NOT NULL, seq int NOT NULL, last int NOT NULL, via text NOT NULL)`)
		if err != nil {
			return err
		}
		var names []string
		for k := range keys {
			names = append(names, keyName("o", k), keyName("p", k))
		}
		_, err = pool.Exec(ctx, `INSERT INTO `+a.keySeq+` (key, seq) SELECT unnest($1::text[]), -1`, names)
		return err
	})
	return a
}

// apply is the handler's work for one message; via names the runner.
func (a *app) apply(ctx context.Context, tx pgx.Tx, m *consumer.Message, via string) error {
	if g := a.gate.Load(); g != nil {
		select {
		case <-*g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	seq, err := strconv.Atoi(faultplan.Header(m.Message, faultplan.SeqHeader))
	if err != nil {
		return retry.Permanent(fmt.Errorf("message %s: bad %s header: %w", m.ID, faultplan.SeqHeader, err))
	}
	key := string(m.Key)
	if _, err := tx.Exec(ctx, `INSERT INTO `+a.effects+` (id, key, seq, part, off, via, runs) VALUES ($1, $2, $3, $4, $5, $6, 1)
		ON CONFLICT (id) DO UPDATE SET runs = `+a.effects+`.runs + 1`,
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
			SELECT $1, $2, $3, coalesce((SELECT seq FROM `+a.keySeq+` WHERE key = $2), -2), $4`, m.ID, key, seq, via); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+a.keySeq+` SET seq = $2 WHERE key = $1`, key, seq); err != nil {
			return err
		}
	}
	return nil
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

func (a *app) count(ctx context.Context) (int64, error) {
	var n int64
	err := a.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+a.effects).Scan(&n)
	return n, err
}

// sources feed the topic: an enqueuer that writes outbox messages (which the
// relays publish) and a producer that writes with acks=all, each over keys
// of its own, each key's messages numbered in order.
type sources struct {
	mu        sync.Mutex
	outboxIDs []string // IDs the outbox gave, in enqueue order

	enqueued, sent atomic.Int64
}

func (s *sources) want(producerMsgs int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.outboxIDs)
	for i := range producerMsgs {
		out = append(out, "p-"+strconv.Itoa(i))
	}
	return out
}

// enqueue writes n outbox messages to topic over keys, 10 per transaction,
// spread over d.
func (s *sources) enqueue(ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, topic string, n, keys int, d time.Duration) error {
	const batch = 10
	tick := time.NewTicker(max(d*batch/time.Duration(n), time.Millisecond))
	defer tick.Stop()
	next := make([]int, keys)
	for from := 0; from < n; from += batch {
		var msgs []outbox.Message
		for i := from; i < min(from+batch, n); i++ {
			k := (i * 7) % keys
			msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(keyName("o", k)),
				Value:   []byte("outbox " + strconv.Itoa(i)),
				Headers: []kafka.Header{{Key: faultplan.SeqHeader, Value: []byte(strconv.Itoa(next[k]))}}})
			next[k]++
		}
		var ids []string
		for {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				ids, err = store.EnqueueTx(ctx, tx, msgs...)
				return err
			})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("enqueue: %d of %d: %w", from, n, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		s.mu.Lock()
		s.outboxIDs = append(s.outboxIDs, ids...)
		s.mu.Unlock()
		s.enqueued.Add(int64(len(ids)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// produce writes n messages (IDs p-0 … p-(n-1)) to topic over keys with
// acks=all, in batches spread over d, each acknowledged before the next; a
// batch that fails is sent again until it succeeds, so a message may stand
// twice in the topic, never out of order.
func (s *sources) produce(ctx context.Context, brokers []string, topic string, n, keys int, d time.Duration) error {
	tr := &kafka.Transport{DialTimeout: 2 * time.Second, MetadataTTL: time.Second}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, Transport: tr,
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000, MaxAttempts: 1,
		WriteTimeout: 5 * time.Second}
	defer w.Close()
	const batch = 20
	tick := time.NewTicker(max(d*batch/time.Duration(n), time.Millisecond))
	defer tick.Stop()
	next := make([]int, keys)
	for from := 0; from < n; from += batch {
		var msgs []kafka.Message
		for i := from; i < min(from+batch, n); i++ {
			k := (i * 7) % keys
			msgs = append(msgs, kafka.Message{Key: []byte(keyName("p", k)), Value: []byte("producer " + strconv.Itoa(i)),
				Headers: []kafka.Header{
					{Key: consumer.IDHeaderDefault, Value: []byte("p-" + strconv.Itoa(i))},
					{Key: faultplan.SeqHeader, Value: []byte(strconv.Itoa(next[k]))},
				}})
			next[k]++
		}
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := w.WriteMessages(wctx, msgs...)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("produce: %d of %d sent: %w", from, n, ctx.Err())
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		s.sent.Add(int64(len(msgs)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

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

// checkEffects fails the test unless every wanted ID has exactly one effect
// and one claim of group, nothing else has either, and no key's messages
// were applied out of sequence.
func (a *app) checkEffects(t *testing.T, ctx context.Context, group string, want []string) {
	t.Helper()
	type effect struct {
		ID   string
		Runs int
	}
	rows, err := a.db.Pool.Query(ctx, `SELECT id, runs FROM `+a.effects)
	if err != nil {
		t.Fatal(err)
	}
	effects, err := pgx.CollectRows(rows, pgx.RowToStructByPos[effect])
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string]bool, len(effects))
	var twice []effect
	for _, e := range effects {
		got[e.ID] = true
		if e.Runs != 1 && len(twice) < 20 {
			twice = append(twice, e)
		}
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
	if len(twice) > 0 {
		t.Errorf("effects applied more than once (first 20): %+v", twice)
	}

	rows, err = a.db.Pool.Query(ctx, `SELECT coalesce(message_id, message_uuid::text) FROM `+a.db.Table("processed_messages")+` WHERE consumer = $1`, group)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	claims := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		claims[id] = true // the primary key makes each claim appear once
	}
	if lost := missing(want, claims); len(lost) > 0 || len(claims) != len(want) {
		t.Errorf("%d claims for %d messages; not claimed (first 20): %v", len(claims), len(want), lost)
	}

	rows, err = a.db.Pool.Query(ctx, `SELECT id, key, seq, last, via FROM `+a.breaks+` ORDER BY key, seq LIMIT 20`)
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

// inTopic returns the IDs of every message in topic, read from brokers, and
// the number of messages read.
func inTopic(t *testing.T, brokers []string, topic string) (map[string]bool, int) {
	t.Helper()
	msgs := testenv.ReadAll(t, brokers, topic)
	ids := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		ids[faultplan.Header(m, consumer.IDHeaderDefault)] = true
	}
	return ids, len(msgs)
}
