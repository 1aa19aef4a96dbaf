package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

// order is one of the demo's orders, pending until its OrderPaid event is
// handled.
type order struct {
	id, account string
	amount      int64 // in cents
}

var orders = []order{
	{"order-840", "ana", 10000},
	{"order-841", "bruno", 2590},
	{"order-842", "ana", 10000},
	{"order-843", "carla", 4990},
	{"order-844", "bruno", 15000},
	{"order-845", "carla", 1250},
	{"order-846", "ana", 7300},
	{"order-847", "bruno", 990},
	{"order-848", "carla", 22000},
	{"order-849", "ana", 3400},
}

const (
	// consumerName scopes the dedup records and the positions: both consumers
	// of the demo share it, whatever their consumer group.
	consumerName = "order-service"
	partitions   = 3
	// crashAfter is how many database commits consumer 1 makes before it stops.
	crashAfter = 5
)

// result is what the scenario observed, for the test.
type result struct {
	Topic    string
	Outcomes map[string][]consumer.Outcome // by message ID, in the order reported
	Retried  string                        // the ID of the event the producer sent twice
	Replayed string                        // the ID of the event replayed after the crash
	Balances map[string]int64              // by account, in cents, at the end
	Expected map[string]int64              // by account: each of its orders paid once
	Paid     int                           // orders with status 'paid'
	Claimed  int                           // rows of processed_messages for consumerName
}

// errNotExactlyOnce is returned when the final state shows a payment applied
// twice or not at all.
var errNotExactlyOnce = errors.New("not every payment was applied exactly once")

// scenario runs the demo against the given servers, in schema (dropped and
// recreated first) and in a new topic (deleted at the end), and writes what
// happens to w.
func scenario(ctx context.Context, dbURL string, brokers []string, schema string, w io.Writer, obs *telemetry) (res *result, err error) {
	var tel *idemotel.Telemetry
	if obs != nil {
		tel = obs.tel
	}
	out := &syncWriter{w: w}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	// The library logs only what needs attention; the story is printed below.
	logger := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))

	say("1. setup")
	pool, err := setupDB(ctx, dbURL, schema, say)
	if err != nil {
		return nil, fmt.Errorf("set up PostgreSQL schema %s: %w", schema, err)
	}
	defer pool.Close()
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return nil, err
	}

	suffix := strings.ToLower(rand.Text()[:6])
	topic := "orders-paid-" + suffix
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	if err := createTopic(ctx, client, topic); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, deleteTopic(ctx, client, topic, say)) }()
	say("   topic %s created with %d partitions (the broker creates no topic by itself)", topic, partitions)

	say("\n2. produce")
	writer := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
	defer func() { err = errors.Join(err, writer.Close()) }()
	events := make([]kafka.Message, len(orders))
	for i, o := range orders {
		events[i] = orderPaid(o)
		if tel != nil {
			// The producer's trace context travels in the headers: the
			// consumer's span for this event continues its trace.
			pctx, span := obs.tracer.Start(ctx, "send OrderPaid")
			tel.Inject(pctx, &events[i].Headers)
			span.End()
		}
	}
	if err := writer.WriteMessages(ctx, events...); err != nil {
		return nil, fmt.Errorf("produce: %w", err)
	}
	say(`   %d OrderPaid events, key = order ID, value {"orderId":…,"amount":…}, header message-id = event ID`, len(events))
	// A producer whose ack got lost sends the same event again.
	retried := events[2]
	if err := writer.WriteMessages(ctx, retried); err != nil {
		return nil, fmt.Errorf("produce: %w", err)
	}
	say("   %s sent twice: a producer retry after a lost ack (same event ID, next offset)", messageID(retried))

	seen := newTally(out)
	newRunner := func(group string, observers ...consumer.Observer) (*consumer.Runner, error) {
		cfg := &consumer.Config{
			Kafka: kafkaconn.Config{Brokers: brokers}, Topic: topic, GroupID: group, Name: consumerName,
			Store: store, Handler: consumer.HandlerFunc(markPaid),
			// One transaction per message, so that the demo's stop lands
			// between two events' commits (by default the runner takes
			// every event already fetched into one transaction).
			BatchSize: 1,
			Logger:    logger, Observers: observers,
		}
		if tel == nil {
			return consumer.New(pool, cfg)
		}
		c, err := tel.Consumer(cfg) // spans and metrics, an observer beside the ones above
		if err != nil {
			return nil, err
		}
		r, err := consumer.New(pool, cfg)
		if err != nil {
			return nil, err
		}
		return r, c.Observe(r) // lag, position, parked gauges
	}

	group1 := consumerName + "-" + suffix + "-1"
	say("\n3. consumer 1 (group %s, name %s): claim + markPaid + commit, then the Kafka offset", group1, consumerName)
	ctx1, crash := context.WithCancel(ctx)
	defer crash()
	var commits atomic.Int32
	// A committed transaction's TxEnd runs once PostgreSQL committed and
	// before the Kafka offset commit: the window in which a crash causes a
	// redelivery.
	r1, err := newRunner(group1, seen, afterCommit(func() {
		if commits.Add(1) == crashAfter {
			crash()
		}
	}))
	if err != nil {
		return nil, err
	}
	if err := r1.Run(ctx1); err != nil {
		return nil, fmt.Errorf("consumer 1: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	say("   ⚡ consumer 1 was stopped from an observer at its database commit #%d (transactions in flight", crashAfter)
	say("     on other partitions still commit): its effects are in PostgreSQL; the Kafka offset commits that")
	say("     follow are what a crash at this point loses")

	group2 := consumerName + "-" + suffix + "-2"
	say("\n4. consumer 2 (group %s, name %s)", group2, consumerName)
	positions, err := store.Positions(ctx, pool, consumerName, topic)
	if err != nil {
		return nil, err
	}
	say("   a new group: Kafka has no offset for it, as if every offset commit of consumer 1 was lost in a crash")
	say("   the same name: it shares consumer 1's processed_messages and the positions committed with the effects:")
	say("   next offset in PostgreSQL: %s", byPartition(positions))
	say("   (without them it would read each partition from offset 0, and dedup would acknowledge what")
	say("   consumer 1 applied as duplicates; with them, nothing consumer 1 committed is delivered again)")
	replay := seen.firstApplied()
	if err := writer.WriteMessages(ctx, replay); err != nil {
		return nil, fmt.Errorf("produce: %w", err)
	}
	say("   meanwhile an operator replays %s, which consumer 1 applied (same event ID, new offset)", messageID(replay))
	end, err := endOffsets(ctx, client, topic)
	if err != nil {
		return nil, err
	}
	ctx2, caughtUp := context.WithCancel(ctx)
	defer caughtUp()
	seen.stopAt(end, caughtUp)
	r2, err := newRunner(group2, seen)
	if err != nil {
		return nil, err
	}
	if err := r2.Run(ctx2); err != nil {
		return nil, fmt.Errorf("consumer 2: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	say("   consumer 2 reached the end of every partition (%s) and stops", byPartition(end))

	say("\n5. final state")
	res = &result{Topic: topic, Outcomes: seen.outcomes, Retried: messageID(retried), Replayed: messageID(replay), Expected: map[string]int64{}}
	for _, o := range orders {
		res.Expected[o.account] += o.amount
	}
	if err := readState(ctx, pool, res); err != nil {
		return nil, err
	}
	ok := res.Paid == len(orders) && res.Claimed == len(orders)
	say("   orders paid: %d of %d", res.Paid, len(orders))
	for _, account := range []string{"ana", "bruno", "carla"} {
		mark := "✓"
		if res.Balances[account] != res.Expected[account] {
			mark, ok = "✗", false
		}
		say("   %-6s balance %8s  expected %8s  %s", account, money(res.Balances[account]), money(res.Expected[account]), mark)
	}
	say("   %d deliveries: %d applied, %d duplicates acknowledged; processed_messages holds %d IDs",
		seen.applied+seen.duplicates, seen.applied, seen.duplicates, res.Claimed)
	if !ok {
		say("   ✗ %v", errNotExactlyOnce)
		return res, errNotExactlyOnce
	}
	say("   ✓ each payment applied exactly once (boundary: PostgreSQL; effect: order status and balance)")
	return res, nil
}

// setupDB drops and recreates schema with idemkit's migrations, then the
// service's tables and pending orders. The pool resolves table names in
// schema, so the service's SQL reads as it would in a database of its own.
func setupDB(ctx context.Context, dbURL, schema string, say func(string, ...any)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	err = func() error {
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			return err
		}
		m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
		if err != nil {
			return err
		}
		applied, err := m.Up(ctx)
		if err != nil {
			return err
		}
		say("   schema %s dropped and recreated; idemkit migrations applied: %v", schema, applied)
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, schemaSQL); err != nil {
				return err
			}
			for _, o := range orders {
				if _, err := tx.Exec(ctx, `INSERT INTO accounts (id) VALUES ($1) ON CONFLICT DO NOTHING`, o.account); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO orders (id, account_id, amount) VALUES ($1, $2, $3)`,
					o.id, o.account, o.amount); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	if err != nil {
		pool.Close()
		return nil, err
	}
	say("   tables accounts and orders created (schema.sql); %d orders pending, %s … %s", len(orders), orders[0].id, orders[len(orders)-1].id)
	return pool, nil
}

// orderPaid is o's OrderPaid event. Its ID names the intent (this order's
// payment), so every retry and replay of the event carries the same one.
func orderPaid(o order) kafka.Message {
	value, _ := json.Marshal(OrderPaid{OrderID: o.id, Amount: o.amount}) // cannot fail
	return kafka.Message{Key: []byte(o.id), Value: value,
		Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("pay-" + o.id)}}}
}

func messageID(m kafka.Message) string {
	for _, h := range m.Headers {
		if h.Key == consumer.IDHeaderDefault {
			return string(h.Value)
		}
	}
	return ""
}

func readState(ctx context.Context, pool *pgxpool.Pool, res *result) error {
	res.Balances = map[string]int64{}
	var account string
	var balance int64
	rows, _ := pool.Query(ctx, `SELECT id, balance FROM accounts`)
	_, err := pgx.ForEachRow(rows, []any{&account, &balance}, func() error {
		res.Balances[account] = balance
		return nil
	})
	if err != nil {
		return fmt.Errorf("read balances: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status = 'paid'`).Scan(&res.Paid); err != nil {
		return fmt.Errorf("count paid orders: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = $1`,
		consumerName).Scan(&res.Claimed); err != nil {
		return fmt.Errorf("count processed messages: %w", err)
	}
	return nil
}

// createTopic creates the demo's topic. kafka-go's client waits until the
// new topic shows in its metadata, so the writer can produce right away.
func createTopic(ctx context.Context, client *kafka.Client, topic string) error {
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1, // one broker in development
	}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// deleteTopic deletes the topic, even when ctx was cancelled.
func deleteTopic(ctx context.Context, client *kafka.Client, topic string, say func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	resp, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("delete topic %s: %w", topic, err)
	}
	say("\ntopic %s deleted", topic)
	return nil
}

// endOffsets returns the offset after the last message of each partition.
func endOffsets(ctx context.Context, client *kafka.Client, topic string) (map[int]int64, error) {
	var reqs []kafka.OffsetRequest
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	resp, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	end := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, p.Partition, p.Error)
		}
		end[p.Partition] = p.LastOffset
	}
	return end, nil
}

// tally is fed by the runners' hooks, which run concurrently on the
// partitions' goroutines: it prints one line per message outcome, keeps the
// outcomes, and calls stop once every partition was handled up to its end.
type tally struct {
	out io.Writer

	mu                  sync.Mutex
	outcomes            map[string][]consumer.Outcome
	applied, duplicates int
	first               *consumer.Message // the first message applied
	next                map[int]int64     // by partition: the offset after the last one handled
	end                 map[int]int64
	stop                func()
}

// afterCommit is a consumer.TxObserver that calls f when a transaction
// committed.
type afterCommit func()

func (f afterCommit) TxStart(ctx context.Context, _ *consumer.TxStartEvent) context.Context {
	return ctx
}

func (f afterCommit) TxEnd(_ context.Context, e *consumer.TxEndEvent) {
	if e.Err == nil {
		f()
	}
}

func newTally(out io.Writer) *tally {
	return &tally{out: out, outcomes: map[string][]consumer.Outcome{}, next: map[int]int64{}}
}

// Outcome makes t a consumer.OutcomeObserver.
func (t *tally) Outcome(_ context.Context, e *consumer.OutcomeEvent) {
	m, o := e.Message, e.Outcome
	t.mu.Lock()
	defer t.mu.Unlock()
	t.outcomes[m.ID] = append(t.outcomes[m.ID], o)
	var what string
	switch o {
	case consumer.Applied:
		t.applied++
		if t.first == nil {
			t.first = m
		}
		var ev OrderPaid
		_ = json.Unmarshal(m.Value, &ev) // markPaid decoded it already
		what = fmt.Sprintf("%s paid, %s +%s", ev.OrderID, accountOf(ev.OrderID), money(ev.Amount))
	case consumer.Duplicate:
		t.duplicates++
		what = "acknowledged; markPaid did not run"
	}
	fmt.Fprintf(t.out, "   %-9s  partition %d offset %-2d message_id=%-14s %s\n", o, m.Partition, m.Offset, m.ID, what)
	t.advance(m.Partition, m.Offset+1)
}

// Assigned makes t a consumer.AssignObserver.
func (t *tally) Assigned(_ context.Context, e *consumer.AssignEvent) {
	partition, start := e.Partition, e.Start
	t.mu.Lock()
	defer t.mu.Unlock()
	if start < 0 { // no position anywhere: kafka.FirstOffset
		fmt.Fprintf(t.out, "   partition %d: nothing handled there yet, starts at its first offset\n", partition)
		return
	}
	fmt.Fprintf(t.out, "   partition %d: resumes at offset %d, its position in PostgreSQL\n", partition, start)
	t.advance(partition, start)
}

// stopAt makes t call stop once every partition was handled up to end.
func (t *tally) stopAt(end map[int]int64, stop func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.end, t.stop = end, stop
}

func (t *tally) advance(partition int, next int64) {
	t.next[partition] = max(t.next[partition], next)
	if t.stop == nil {
		return
	}
	for p, end := range t.end {
		if t.next[p] < end {
			return
		}
	}
	t.stop()
}

// firstApplied returns a copy of the first message applied, as a replay
// would send it again.
func (t *tally) firstApplied() kafka.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	return kafka.Message{Key: t.first.Key, Value: t.first.Value, Headers: t.first.Headers}
}

func accountOf(orderID string) string {
	for _, o := range orders {
		if o.id == orderID {
			return o.account
		}
	}
	return "?"
}

// byPartition formats offsets by partition, in partition order.
func byPartition(offsets map[int]int64) string {
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(offsets)) {
		parts = append(parts, fmt.Sprintf("partition %d: %d", p, offsets[p]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func money(cents int64) string { return fmt.Sprintf("%d.%02d", cents/100, cents%100) }

// syncWriter serializes writes from the hooks and the logger.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
