package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

func claim(t *testing.T, s *dedup.Store, tx pgx.Tx, c dedup.Claim) bool {
	t.Helper()
	dup, err := s.ClaimTx(context.Background(), tx, c)
	if err != nil {
		t.Fatalf("ClaimTx(%+v): %v", c, err)
	}
	return dup
}

func claimWithPosition(t *testing.T, s *dedup.Store, tx pgx.Tx, c dedup.Claim) bool {
	t.Helper()
	dup, err := s.ClaimWithPositionTx(context.Background(), tx, c)
	if err != nil {
		t.Fatalf("ClaimWithPositionTx(%+v): %v", c, err)
	}
	return dup
}

func positions(t *testing.T, s *dedup.Store, q dedup.DBTX, consumer, topic string) map[int]int64 {
	t.Helper()
	p, err := s.Positions(context.Background(), q, consumer, topic)
	if err != nil {
		t.Fatalf("Positions(%s, %s): %v", consumer, topic, err)
	}
	return p
}

func wantPositions(t *testing.T, got, want map[int]int64) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Fatalf("positions = %v, want %v", got, want)
	}
}

type row struct {
	topic     string
	partition int
	offset    int64
}

// processedRows returns the stored rows per (consumer, message ID) key "c/id".
func processedRows(t *testing.T, db *testenv.DB) map[string]row {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), "SELECT consumer, message_id, topic, kafka_partition, kafka_offset FROM "+
		db.Table(migrate.ProcessedMessagesDefault))
	if err != nil {
		t.Fatalf("read processed rows: %v", err)
	}
	out := map[string]row{}
	var consumer, id string
	var r row
	if _, err := pgx.ForEachRow(rows, []any{&consumer, &id, &r.topic, &r.partition, &r.offset}, func() error {
		out[consumer+"/"+id] = r
		return nil
	}); err != nil {
		t.Fatalf("read processed rows: %v", err)
	}
	return out
}

func TestClaimNewThenDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	first := dedup.Claim{Consumer: "billing", MessageID: "order-1", Topic: "orders", Partition: 2, Offset: 40}

	inTx(t, db.Pool, func(tx pgx.Tx) {
		if claim(t, s, tx, first) {
			t.Fatal("first claim reported a duplicate")
		}
		// The transaction sees its own claim; the pool does not yet.
		if ok, err := s.Processed(ctx, tx, "billing", "order-1"); err != nil || !ok {
			t.Fatalf("Processed in the claiming tx = %v, %v; want true", ok, err)
		}
		if ok, err := s.Processed(ctx, db.Pool, "billing", "order-1"); err != nil || ok {
			t.Fatalf("Processed outside the uncommitted tx = %v, %v; want false", ok, err)
		}
	})
	redelivery := first
	redelivery.Offset = 41
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if !claim(t, s, tx, redelivery) {
			t.Fatal("second claim of the same ID was not a duplicate")
		}
	})
	// Same ID, another consumer: a claim of its own.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if claim(t, s, tx, dedup.Claim{Consumer: "shipping", MessageID: "order-1", Topic: "orders", Partition: 2, Offset: 40}) {
			t.Fatal("claim by another consumer reported a duplicate")
		}
	})
	if ok, err := s.Processed(ctx, db.Pool, "billing", "order-1"); err != nil || !ok {
		t.Fatalf("Processed after commit = %v, %v; want true", ok, err)
	}
	if ok, err := s.Processed(ctx, db.Pool, "billing", "order-2"); err != nil || ok {
		t.Fatalf("Processed of an unknown ID = %v, %v; want false", ok, err)
	}
	want := map[string]row{
		"billing/order-1":  {"orders", 2, 40},
		"shipping/order-1": {"orders", 2, 40},
	}
	if got := processedRows(t, db); !maps.Equal(got, want) {
		t.Fatalf("rows = %v, want %v", got, want)
	}
	// ClaimTx alone records no position.
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{})
}

func TestRollbackReleasesClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	c := dedup.Claim{Consumer: "billing", MessageID: "order-7", Topic: "orders", Partition: 0, Offset: 7}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if claim(t, s, tx, c) {
		t.Fatal("claim reported a duplicate")
	}
	if claimWithPosition(t, s, tx, dedup.Claim{Consumer: "billing", MessageID: "order-8", Topic: "orders", Offset: 8}) {
		t.Fatal("claim with position reported a duplicate")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Processed(ctx, db.Pool, "billing", "order-7"); err != nil || ok {
		t.Fatalf("Processed after rollback = %v, %v; want false", ok, err)
	}
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{})

	inTx(t, db.Pool, func(tx pgx.Tx) {
		if claim(t, s, tx, c) {
			t.Fatal("claim after rollback reported a duplicate")
		}
	})
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if !claim(t, s, tx, c) {
			t.Fatal("claim after the committed claim was not a duplicate")
		}
	})
}

func TestConcurrentClaimsOfOneID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	const n = 50
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		fresh atomic.Int32
		dups  atomic.Int32
		errs  = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				dup, err := s.ClaimWithPositionTx(ctx, tx, dedup.Claim{
					Consumer: "billing", MessageID: "order-1", Topic: "orders", Partition: 0, Offset: int64(i),
				})
				if err != nil {
					return err
				}
				if dup {
					dups.Add(1)
				} else {
					fresh.Add(1)
				}
				return nil
			})
			if err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent claim: %v", err)
	}
	if fresh.Load() != 1 || dups.Load() != n-1 {
		t.Fatalf("new claims = %d, duplicates = %d; want 1 and %d", fresh.Load(), dups.Load(), n-1)
	}
	if got := count(t, db.Pool, "SELECT count(*) FROM "+db.Table(migrate.ProcessedMessagesDefault)); got != 1 {
		t.Fatalf("%d rows, want 1", got)
	}
	// Every transaction recorded its position; the highest wins.
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{0: n})
}

func TestClaimWithPositionKeepsMax(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	steps := []struct {
		id        string
		partition int
		offset    int64
		dup       bool
		want      map[int]int64
	}{
		{"m5", 0, 5, false, map[int]int64{0: 6}},
		{"m3", 0, 3, false, map[int]int64{0: 6}}, // lower offset: position stays
		{"m10", 0, 10, false, map[int]int64{0: 11}},
		{"m5", 0, 20, true, map[int]int64{0: 21}}, // duplicates move the position too
		{"m5", 0, 1, true, map[int]int64{0: 21}},
		{"p1", 1, 0, false, map[int]int64{0: 21, 1: 1}},
	}
	for _, st := range steps {
		inTx(t, db.Pool, func(tx pgx.Tx) {
			dup := claimWithPosition(t, s, tx, dedup.Claim{
				Consumer: "billing", MessageID: st.id, Topic: "orders", Partition: st.partition, Offset: st.offset,
			})
			if dup != st.dup {
				t.Fatalf("claim %s@%d: duplicate = %v, want %v", st.id, st.offset, dup, st.dup)
			}
		})
		wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), st.want)
	}
	// Positions are per consumer and topic.
	wantPositions(t, positions(t, s, db.Pool, "shipping", "orders"), map[int]int64{})
	wantPositions(t, positions(t, s, db.Pool, "billing", "payments"), map[int]int64{})

	// SavePositionTx never moves back either.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if err := s.SavePositionTx(ctx, tx, "billing", "orders", 0, 15, time.Time{}, 0); err != nil {
			t.Fatalf("SavePositionTx: %v", err)
		}
		if err := s.SavePositionTx(ctx, tx, "billing", "orders", 1, 30, time.Time{}, 0); err != nil {
			t.Fatalf("SavePositionTx: %v", err)
		}
		if err := s.SavePositionTx(ctx, tx, "billing", "orders", 7, 0, time.Time{}, 0); err != nil {
			t.Fatalf("SavePositionTx: %v", err)
		}
		// The transaction sees its own positions.
		wantPositions(t, positions(t, s, tx, "billing", "orders"), map[int]int64{0: 21, 1: 30, 7: 0})
	})
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{0: 21, 1: 30, 7: 0})
	if got := count(t, db.Pool, "SELECT count(*) FROM "+db.Table(migrate.ProcessedMessagesDefault)); got != 4 {
		t.Fatalf("%d processed rows, want 4 (m5, m3, m10, p1)", got)
	}
}

// TestClaimBatchOnePartition covers the consumer's batches (one consumer,
// topic and partition), which travel as scalars and two arrays.
func TestClaimBatchOnePartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	inTx(t, db.Pool, func(tx pgx.Tx) {
		claim(t, s, tx, dedup.Claim{Consumer: "billing", MessageID: "a", Topic: "orders", Partition: 3, Offset: 1})
	})
	batch := []dedup.Claim{
		{Consumer: "billing", MessageID: "z", Topic: "orders", Partition: 3, Offset: 7},
		{Consumer: "billing", MessageID: "a", Topic: "orders", Partition: 3, Offset: 8}, // claimed before
		{Consumer: "billing", MessageID: "m", Topic: "orders", Partition: 3, Offset: 9},
		{Consumer: "billing", MessageID: "z", Topic: "orders", Partition: 3, Offset: 10}, // in-batch duplicate
	}
	var got []bool
	inTx(t, db.Pool, func(tx pgx.Tx) {
		var err error
		if got, err = s.ClaimBatchTx(ctx, tx, batch); err != nil {
			t.Fatalf("ClaimBatchTx: %v", err)
		}
	})
	if want := []bool{false, true, false, true}; !slices.Equal(got, want) {
		t.Fatalf("duplicate = %v, want %v", got, want)
	}
	wantRows := map[string]row{"billing/a": {"orders", 3, 1}, "billing/z": {"orders", 3, 7}, "billing/m": {"orders", 3, 9}}
	if rows := processedRows(t, db); !maps.Equal(rows, wantRows) {
		t.Fatalf("rows = %v, want %v", rows, wantRows)
	}
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{3: 11})
}

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	inTx(t, db.Pool, func(tx pgx.Tx) {
		claim(t, s, tx, dedup.Claim{Consumer: "billing", MessageID: "a", Topic: "orders", Partition: 0, Offset: 1})
		if err := s.SavePositionTx(ctx, tx, "billing", "orders", 2, 100, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	})

	batch := []dedup.Claim{
		{Consumer: "billing", MessageID: "a", Topic: "orders", Partition: 0, Offset: 10}, // claimed before
		{Consumer: "billing", MessageID: "b", Topic: "orders", Partition: 0, Offset: 11},
		{Consumer: "billing", MessageID: "c", Topic: "orders", Partition: 0, Offset: 12},
		{Consumer: "billing", MessageID: "b", Topic: "orders", Partition: 0, Offset: 13}, // in-batch duplicate
		{Consumer: "billing", MessageID: "d", Topic: "orders", Partition: 1, Offset: 5},
		{Consumer: "billing", MessageID: "c", Topic: "orders", Partition: 0, Offset: 40}, // highest offset, a duplicate
		{Consumer: "shipping", MessageID: "a", Topic: "orders", Partition: 0, Offset: 3}, // other consumer: new
		{Consumer: "billing", MessageID: "e", Topic: "orders", Partition: 2, Offset: 50}, // below the saved 100
	}
	var got []bool
	inTx(t, db.Pool, func(tx pgx.Tx) {
		var err error
		got, err = s.ClaimBatchTx(ctx, tx, batch)
		if err != nil {
			t.Fatalf("ClaimBatchTx: %v", err)
		}
	})
	want := []bool{true, false, false, true, false, true, false, false}
	if !slices.Equal(got, want) {
		t.Fatalf("duplicate = %v, want %v", got, want)
	}
	wantRows := map[string]row{
		"billing/a":  {"orders", 0, 1},
		"billing/b":  {"orders", 0, 11},
		"billing/c":  {"orders", 0, 12},
		"billing/d":  {"orders", 1, 5},
		"billing/e":  {"orders", 2, 50},
		"shipping/a": {"orders", 0, 3},
	}
	if rows := processedRows(t, db); !maps.Equal(rows, wantRows) {
		t.Fatalf("rows = %v, want %v", rows, wantRows)
	}
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{0: 41, 1: 6, 2: 100})
	wantPositions(t, positions(t, s, db.Pool, "shipping", "orders"), map[int]int64{0: 4})

	// The same batch again: all duplicates, positions unchanged.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		again, err := s.ClaimBatchTx(ctx, tx, batch)
		if err != nil {
			t.Fatalf("ClaimBatchTx again: %v", err)
		}
		if !slices.Equal(again, []bool{true, true, true, true, true, true, true, true}) {
			t.Fatalf("duplicate on replay = %v, want all true", again)
		}
	})
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{0: 41, 1: 6, 2: 100})

	// An empty batch does nothing and is not an error.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		empty, err := s.ClaimBatchTx(ctx, tx, nil)
		if err != nil || len(empty) != 0 {
			t.Fatalf("ClaimBatchTx(nil) = %v, %v; want empty, nil", empty, err)
		}
	})
}

func TestConcurrentOverlappingBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	// Eight transactions claim the same 200 IDs in different orders: each ID
	// is new exactly once, and no transaction deadlocks.
	const workers, ids = 8, 200
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		mu     sync.Mutex
		claims = map[string]int{}
		errs   = make(chan error, workers)
	)
	for w := range workers {
		batch := make([]dedup.Claim, ids)
		for i := range ids {
			j := (i*7 + w*31) % ids // a different permutation per worker
			if w%2 == 1 {
				j = ids - 1 - j
			}
			batch[i] = dedup.Claim{Consumer: "c", MessageID: fmt.Sprintf("id-%03d", j), Topic: "t", Partition: j % 3, Offset: int64(j)}
		}
		wg.Go(func() {
			<-start
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				dup, err := s.ClaimBatchTx(ctx, tx, batch)
				if err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				for i, d := range dup {
					if !d {
						claims[batch[i].MessageID]++
					}
				}
				return nil
			})
			if err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent batch: %v", err)
	}
	if len(claims) != ids {
		t.Fatalf("%d IDs claimed as new, want %d", len(claims), ids)
	}
	for id, n := range claims {
		if n != 1 {
			t.Fatalf("%s claimed as new %d times", id, n)
		}
	}
	wantPositions(t, positions(t, s, db.Pool, "c", "t"), map[int]int64{0: 199, 1: 200, 2: 198})
}

func TestInvalidInputWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	valid := dedup.Claim{Consumer: "billing", MessageID: "order-1", Topic: "orders", Partition: 0, Offset: 0}
	badIDs := map[string]string{
		"empty":         "",
		"256 bytes":     strings.Repeat("x", 256),
		"NUL":           "\x00",
		"newline":       "a\nb",
		"invalid UTF-8": "\xff",
		"DEL":           "a\x7fb",
		"C1 control":    "a\u0085b",
	}
	type method struct {
		name string
		call func(tx pgx.Tx, c dedup.Claim) error
	}
	methods := []method{
		{"ClaimTx", func(tx pgx.Tx, c dedup.Claim) error { _, err := s.ClaimTx(ctx, tx, c); return err }},
		{"ClaimWithPositionTx", func(tx pgx.Tx, c dedup.Claim) error { _, err := s.ClaimWithPositionTx(ctx, tx, c); return err }},
		{"ClaimBatchTx", func(tx pgx.Tx, c dedup.Claim) error {
			_, err := s.ClaimBatchTx(ctx, tx, []dedup.Claim{{Consumer: "billing", MessageID: "ok", Topic: "orders"}, c})
			return err
		}},
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		for _, m := range methods {
			for name, bad := range badIDs {
				for _, field := range []string{"Consumer", "MessageID"} {
					c := valid
					if field == "Consumer" {
						c.Consumer = bad
					} else {
						c.MessageID = bad
					}
					err := m.call(tx, c)
					var idErr *dedup.InvalidIDError
					if !errors.Is(err, dedup.ErrInvalidID) || !errors.Is(err, dedup.ErrInvalidInput) ||
						!errors.As(err, &idErr) || idErr.Field != field || !strings.Contains(err.Error(), field) {
						t.Fatalf("%s with %s %s: err = %v; want an *InvalidIDError for %s", m.name, name, field, err, field)
					}
				}
			}
			for name, c := range map[string]dedup.Claim{
				"empty topic":        {Consumer: "billing", MessageID: "x", Topic: ""},
				"negative partition": {Consumer: "billing", MessageID: "x", Topic: "orders", Partition: -1},
				"huge partition":     {Consumer: "billing", MessageID: "x", Topic: "orders", Partition: 1 << 31},
				"negative offset":    {Consumer: "billing", MessageID: "x", Topic: "orders", Offset: -1},
			} {
				err := m.call(tx, c)
				if !errors.Is(err, dedup.ErrInvalidInput) || errors.Is(err, dedup.ErrInvalidID) {
					t.Fatalf("%s with %s: err = %v; want ErrInvalidInput and not ErrInvalidID", m.name, name, err)
				}
			}
		}
		if err := s.SavePositionTx(ctx, tx, "billing", "orders", 0, -1, time.Time{}, 0); !errors.Is(err, dedup.ErrInvalidInput) {
			t.Fatalf("SavePositionTx with negative offset: %v; want ErrInvalidInput", err)
		}
		if err := s.SavePositionTx(ctx, tx, "a\nb", "orders", 0, 1, time.Time{}, 0); !errors.Is(err, dedup.ErrInvalidID) {
			t.Fatalf("SavePositionTx with invalid consumer: %v; want ErrInvalidID", err)
		}
		if _, err := s.Processed(ctx, tx, "billing", ""); !errors.Is(err, dedup.ErrInvalidID) {
			t.Fatalf("Processed with empty ID: %v; want ErrInvalidID", err)
		}
		if _, err := s.Positions(ctx, tx, "billing", ""); !errors.Is(err, dedup.ErrInvalidInput) {
			t.Fatalf("Positions with empty topic: %v; want ErrInvalidInput", err)
		}
		// No SQL ran: the transaction is still usable, and empty.
		if got := count(t, tx, "SELECT count(*) FROM "+db.Table(migrate.ProcessedMessagesDefault)); got != 0 {
			t.Fatalf("%d processed rows after invalid claims, want 0", got)
		}
		if got := count(t, tx, "SELECT count(*) FROM "+db.Table(migrate.ConsumerPositionsDefault)); got != 0 {
			t.Fatalf("%d position rows after invalid claims, want 0", got)
		}
		if claim(t, s, tx, valid) {
			t.Fatal("valid claim after invalid ones reported a duplicate")
		}
	})
	if got := count(t, db.Pool, "SELECT count(*) FROM "+db.Table(migrate.ProcessedMessagesDefault)); got != 1 {
		t.Fatalf("%d processed rows, want 1", got)
	}
	if _, err := s.ClaimTx(ctx, nil, valid); err == nil {
		t.Fatal("ClaimTx with a nil tx succeeded")
	}
}

func TestValidateID(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"order-1", strings.Repeat("x", dedup.MaxIDLength), "zamówienie-ü-日本", "a b\u00a0c", "{\"k\":1}"} {
		if err := dedup.ValidateID("MessageID", v); err != nil {
			t.Errorf("ValidateID(%q) = %v, want nil", v, err)
		}
	}
	for v, reason := range map[string]string{
		"":                       "empty",
		strings.Repeat("é", 128): "256 bytes",
		"\x00":                   "control",
		"a\tb":                   "control",
		"a\xffb":                 "UTF-8",
	} {
		err := dedup.ValidateID("Consumer", v)
		var idErr *dedup.InvalidIDError
		if !errors.As(err, &idErr) || !errors.Is(err, dedup.ErrInvalidID) {
			t.Fatalf("ValidateID(%q) = %v, want an *InvalidIDError", v, err)
		}
		if idErr.Field != "Consumer" || idErr.Value != v || !strings.Contains(err.Error(), "Consumer") ||
			!strings.Contains(err.Error(), reason) {
			t.Fatalf("ValidateID(%q) = %#v (%q); want field Consumer and a reason containing %q", v, idErr, err, reason)
		}
	}
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	if _, err := dedup.New(nil); err != nil {
		t.Fatalf("New(nil): %v", err)
	}
	for _, cfg := range []dedup.Config{
		{Tables: migrate.Tables{Schema: strings.Repeat("s", 64)}},
		{Tables: migrate.Tables{ProcessedMessages: "a\x00"}},
		{Tables: migrate.Tables{ConsumerPositions: "\xff"}},
		{Tables: migrate.Tables{ProcessedMessages: "x", ConsumerPositions: "x"}},
	} {
		if _, err := dedup.New(&cfg); !errors.Is(err, migrate.ErrInvalidConfig) {
			t.Fatalf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestCustomTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tables := migrate.Tables{ProcessedMessages: `Odd "Name"`, ConsumerPositions: `pos'itions`, Migrations: "m"}
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		tables := tables
		tables.Schema = schema
		m, err := migrate.New(pool, &migrate.Config{Tables: tables})
		if err != nil {
			return err
		}
		_, err = m.Up(ctx)
		return err
	})
	tables.Schema = db.Schema
	s, err := dedup.New(&dedup.Config{Tables: tables})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if claimWithPosition(t, s, tx, dedup.Claim{Consumer: "c", MessageID: "m", Topic: "t", Partition: 3, Offset: 9}) {
			t.Fatal("claim reported a duplicate")
		}
		dup, err := s.ClaimBatchTx(ctx, tx, []dedup.Claim{{Consumer: "c", MessageID: "m", Topic: "t", Partition: 3, Offset: 9}})
		if err != nil || !slices.Equal(dup, []bool{true}) {
			t.Fatalf("ClaimBatchTx = %v, %v; want [true]", dup, err)
		}
	})
	if got := count(t, db.Pool, "SELECT count(*) FROM "+db.Table(`Odd "Name"`)+" WHERE message_id = 'm'"); got != 1 {
		t.Fatalf("%d rows in the custom table, want 1", got)
	}
	wantPositions(t, positions(t, s, db.Pool, "c", "t"), map[int]int64{3: 10})
	if n, err := s.Purge(ctx, db.Pool, time.Hour, 0); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want 0, nil", n, err)
	}
}

// deleteCounter is a pgx tracer that records the rows each DELETE removed.
type deleteCounter struct {
	mu      sync.Mutex
	deletes []int64
}

func (d *deleteCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (d *deleteCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil && data.CommandTag.Delete() {
		d.mu.Lock()
		d.deletes = append(d.deletes, data.CommandTag.RowsAffected())
		d.mu.Unlock()
	}
}

func (d *deleteCounter) take() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.deletes
	d.deletes = nil
	return out
}

func TestPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	table := db.Table(migrate.ProcessedMessagesDefault)

	// A pool on the same schema whose tracer sees each DELETE statement.
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	tracer := &deleteCounter{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	addBatch := func(prefix string, n int, age string) {
		t.Helper()
		batch := make([]dedup.Claim, n)
		for i := range batch {
			batch[i] = dedup.Claim{Consumer: "billing", MessageID: fmt.Sprintf("%s-%05d", prefix, i), Topic: "orders", Offset: int64(i)}
		}
		inTx(t, db.Pool, func(tx pgx.Tx) {
			if _, err := s.ClaimBatchTx(ctx, tx, batch); err != nil {
				t.Fatalf("ClaimBatchTx: %v", err)
			}
			if age != "" {
				if _, err := tx.Exec(ctx, "UPDATE "+table+" SET processed_at = now() - $1::interval WHERE message_id LIKE $2",
					age, prefix+"-%"); err != nil {
					t.Fatalf("age rows: %v", err)
				}
			}
		})
	}
	addBatch("old", 2500, "2 hours")
	addBatch("recent", 7, "59 minutes")
	addBatch("new", 10, "")

	if _, err := s.Purge(ctx, pool, 0, 10); !errors.Is(err, dedup.ErrInvalidInput) {
		t.Fatalf("Purge(olderThan 0) = %v, want ErrInvalidInput", err)
	}
	n, err := s.Purge(ctx, pool, time.Hour, 1000)
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if n != 2500 {
		t.Fatalf("Purge deleted %d, want 2500", n)
	}
	if got := tracer.take(); !slices.Equal(got, []int64{1000, 1000, 500}) {
		t.Fatalf("DELETE statements removed %v rows, want [1000 1000 500]", got)
	}
	if got := count(t, db.Pool, "SELECT count(*) FROM "+table+" WHERE message_id LIKE 'old-%'"); got != 0 {
		t.Fatalf("%d old rows left, want 0", got)
	}
	if got := count(t, db.Pool, "SELECT count(*) FROM "+table+" WHERE message_id NOT LIKE 'old-%'"); got != 17 {
		t.Fatalf("%d newer rows left, want 17", got)
	}
	// After expiry a redelivered message counts as new.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if claim(t, s, tx, dedup.Claim{Consumer: "billing", MessageID: "old-00042", Topic: "orders"}) {
			t.Fatal("purged ID still reported as a duplicate")
		}
	})
	// Positions are not purged.
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{0: 2500})

	// Nothing left to purge: one statement, nothing deleted.
	n, err = s.Purge(ctx, pool, time.Hour, 1000)
	if err != nil || n != 0 {
		t.Fatalf("second Purge = %d, %v; want 0, nil", n, err)
	}
	if got := tracer.take(); !slices.Equal(got, []int64{0}) {
		t.Fatalf("second Purge DELETE statements removed %v, want [0]", got)
	}

	// batchSize <= 0 means PurgeBatchDefault.
	addBatch("older", 1200, "3 hours")
	n, err = s.Purge(ctx, pool, time.Hour, 0)
	if err != nil || n != 1200 {
		t.Fatalf("Purge with default batch = %d, %v; want 1200, nil", n, err)
	}
	if got := tracer.take(); !slices.Equal(got, []int64{dedup.PurgeBatchDefault, 200}) {
		t.Fatalf("default-batch DELETE statements removed %v, want [1000 200]", got)
	}

	// A cancelled context stops Purge.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Purge(cancelled, pool, time.Hour, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("Purge with cancelled ctx = %v, want context.Canceled", err)
	}
}
