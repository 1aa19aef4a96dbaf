// Package smoke checks the test servers themselves: kafka-go produces to and
// consumes from the real broker with a consumer group, and writes what it
// reads to the real PostgreSQL. Everything later in idemkit stands on this.
package smoke

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func TestMain(m *testing.M) { testenv.Main(m, containers.Start) }

const (
	messages   = 1000
	keys       = 50
	partitions = 3
	firstRun   = 400 // messages the first consumer handles before it stops
)

// TestProduceConsumeResume produces 1,000 keyed messages to a 3-partition
// topic, consumes them with a consumer group into a Postgres table, stops the
// group part-way and starts it again: every message arrives once, in order
// within its partition and key, and the second run starts exactly at the
// offsets the first one committed.
func TestProduceConsumeResume(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	topic := testenv.NewTopic(t, partitions)
	group := testenv.Name(t, "group")
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.received (
			part   int    NOT NULL,
			off    bigint NOT NULL,
			key    text   NOT NULL,
			seq    int    NOT NULL,
			run    int    NOT NULL,
			n      bigserial,
			PRIMARY KEY (part, off))`)
		return err
	})
	table := db.Table("received")

	w := &kafka.Writer{
		Addr:         kafka.TCP(testenv.Brokers(t)...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
	}
	batch := make([]kafka.Message, 0, messages)
	for i := range messages {
		key := fmt.Sprintf("key-%02d", i%keys)
		batch = append(batch, kafka.Message{Key: []byte(key), Value: []byte(strconv.Itoa(i / keys))})
	}
	if err := w.WriteMessages(ctx, batch...); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close writer: %v", err)
	}

	consume := func(run, limit int) (handled, duplicates int) {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:        testenv.Brokers(t),
			GroupID:        group,
			Topic:          topic,
			StartOffset:    kafka.FirstOffset,
			CommitInterval: 0, // synchronous commits, after the row is written
			MaxWait:        100 * time.Millisecond,
		})
		defer func() {
			if err := r.Close(); err != nil {
				t.Errorf("close reader: %v", err)
			}
		}()
		for handled < limit {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatalf("run %d: fetch after %d messages: %v", run, handled, err)
			}
			seq, err := strconv.Atoi(string(m.Value))
			if err != nil {
				t.Fatalf("bad value %q", m.Value)
			}
			tag, err := db.Pool.Exec(ctx, `INSERT INTO `+table+` (part, off, key, seq, run) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (part, off) DO NOTHING`, m.Partition, m.Offset, string(m.Key), seq, run)
			if err != nil {
				t.Fatalf("insert: %v", err)
			}
			if tag.RowsAffected() == 0 {
				duplicates++
			}
			if err := r.CommitMessages(ctx, m); err != nil {
				t.Fatalf("commit offset: %v", err)
			}
			handled++
		}
		return handled, duplicates
	}

	if _, dup := consume(1, firstRun); dup != 0 {
		t.Fatalf("first run read %d messages twice", dup)
	}
	if _, dup := consume(2, messages-firstRun); dup != 0 {
		t.Fatalf("second run re-read %d messages the first run had committed", dup)
	}

	var total, distinctKeys int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM `+table).Scan(&total, &distinctKeys); err != nil {
		t.Fatal(err)
	}
	if total != messages || distinctKeys != keys {
		t.Fatalf("got %d rows over %d keys, want %d over %d", total, distinctKeys, messages, keys)
	}

	// In the order they were handled, offsets rise within each partition and
	// sequence numbers rise by one within each key, across both runs.
	rows, err := db.Pool.Query(ctx, `SELECT part, off, key, seq, run FROM `+table+` ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	lastOff := map[int]int64{}
	nextSeq := map[string]int{}
	firstOfRun2 := map[int]int64{}
	lastOfRun1 := map[int]int64{}
	for rows.Next() {
		var part, seq, run int
		var off int64
		var key string
		if err := rows.Scan(&part, &off, &key, &seq, &run); err != nil {
			t.Fatal(err)
		}
		if prev, ok := lastOff[part]; ok && off != prev+1 {
			t.Fatalf("partition %d: offset %d handled after %d", part, off, prev)
		}
		lastOff[part] = off
		if seq != nextSeq[key] {
			t.Fatalf("key %s: seq %d handled where %d was due", key, seq, nextSeq[key])
		}
		nextSeq[key]++
		if run == 1 {
			lastOfRun1[part] = off
		} else if _, ok := firstOfRun2[part]; !ok {
			firstOfRun2[part] = off
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var resumed []string
	for part, first := range firstOfRun2 {
		if last, ok := lastOfRun1[part]; ok && first != last+1 {
			t.Fatalf("partition %d: second run started at %d, the first committed up to %d", part, first, last)
		}
		resumed = append(resumed, fmt.Sprintf("p%d@%d", part, first))
	}
	t.Logf("1,000 messages over %d partitions; second run resumed at %s", partitions, strings.Join(resumed, " "))
}
