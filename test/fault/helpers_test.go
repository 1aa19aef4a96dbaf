package fault

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
)

// effectsDDL is the business table of these tests: one row per message ID
// with how often its effect ran, and the order effects were applied in.
const effectsDDL = `CREATE TABLE %s (
	id        text   PRIMARY KEY,
	part      int    NOT NULL,
	off       bigint NOT NULL,
	runs      int    NOT NULL,
	applied   bigserial)`

func newDB(t *testing.T) *testenv.DB {
	t.Helper()
	return testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, fmt.Sprintf(effectsDDL, pgx.Identifier{schema, "effects"}.Sanitize()))
		return err
	})
}

// applyEffect is the handler's business write.
func applyEffect(ctx context.Context, tx pgx.Tx, table string, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, part, off, runs) VALUES ($1, $2, $3, 1)
		ON CONFLICT (id) DO UPDATE SET runs = `+table+`.runs + 1`, m.ID, m.Partition, m.Offset)
	return err
}

func batchEffect(ctx context.Context, tx pgx.Tx, table string, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	parts := make([]int32, len(msgs))
	offs := make([]int64, len(msgs))
	for i, m := range msgs {
		ids[i], parts[i], offs[i] = m.ID, int32(m.Partition), m.Offset
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, part, off, runs)
		SELECT id, part, off, 1 FROM unnest($1::text[], $2::int[], $3::bigint[]) WITH ORDINALITY AS t(id, part, off, ord)
		ORDER BY ord
		ON CONFLICT (id) DO UPDATE SET runs = `+table+`.runs + 1`, ids, parts, offs)
	return err
}

// produce writes n messages with IDs prefix-0..n-1 spread over keys.
func produce(t *testing.T, topic, prefix string, from, n, keys int) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 500}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	msgs := make([]kafka.Message, 0, n)
	for i := from; i < from+n; i++ {
		msgs = append(msgs, kafka.Message{
			Key:     []byte("key-" + strconv.Itoa(i%keys)),
			Value:   []byte(strconv.Itoa(i)),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(prefix + strconv.Itoa(i))}},
		})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// effectRuns returns how often each message's effect ran.
func effectRuns(t *testing.T, db *testenv.DB) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT id, runs FROM `+db.Table("effects"))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkOrder fails when, within a partition, effects were applied out of
// offset order.
func checkOrder(t *testing.T, db *testenv.DB) {
	t.Helper()
	var bad int
	err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT off < lag(off) OVER (PARTITION BY part ORDER BY applied) AS backwards FROM `+db.Table("effects")+`
	) s WHERE backwards`).Scan(&bad)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Fatalf("%d effects were applied before an effect of a lower offset in the same partition", bad)
	}
}
