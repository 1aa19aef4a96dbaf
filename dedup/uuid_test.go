package dedup_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// storedAs reports how id is stored for consumer: "uuid", "text" or "" (no
// row), failing when the rows are not one.
func storedAs(t *testing.T, db *testenv.DB, consumer, id string) string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT CASE WHEN message_uuid IS NOT NULL THEN 'uuid' ELSE 'text' END
	FROM `+db.Table(migrate.ProcessedMessagesDefault)+`
	WHERE consumer = $1 AND (message_id = $2 OR message_uuid::text = $2)`, consumer, id)
	if err != nil {
		t.Fatal(err)
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	switch len(kinds) {
	case 0:
		return ""
	case 1:
		return kinds[0]
	}
	t.Fatalf("%s/%s stored %d times: %v", consumer, id, len(kinds), kinds)
	return ""
}

func TestCanonicalUUIDStoredAsUUID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	const id = "0b7e2f4c-3a51-4d2e-9f60-1c2d3e4f5a6b"
	cases := []struct{ id, want string }{
		{id, "uuid"},
		{strings.ToUpper(id), "text"},             // not canonical: another ID, kept as it is
		{"{" + id + "}", "text"},                  // braces
		{strings.ReplaceAll(id, "-", ""), "text"}, // no hyphens
		{id[:35] + "g", "text"},                   // not hex
		{"00000000-0000-0000-0000-000000000000", "uuid"},
		{"ffffffff-ffff-ffff-ffff-ffffffffffff", "uuid"},
		{"order-1", "text"},
	}
	for i, c := range cases {
		cl := dedup.Claim{Consumer: "billing", MessageID: c.id, Topic: "orders", Offset: int64(i)}
		inTx(t, db.Pool, func(tx pgx.Tx) {
			if claim(t, s, tx, cl) {
				t.Fatalf("first claim of %q reported a duplicate", c.id)
			}
		})
		if got := storedAs(t, db, "billing", c.id); got != c.want {
			t.Fatalf("%q stored as %q, want %q", c.id, got, c.want)
		}
		for _, again := range []func(tx pgx.Tx) bool{
			func(tx pgx.Tx) bool { return claim(t, s, tx, cl) },
			func(tx pgx.Tx) bool { return claimWithPosition(t, s, tx, cl) },
			func(tx pgx.Tx) bool {
				d, err := s.ClaimBatchTx(ctx, tx, []dedup.Claim{cl})
				if err != nil {
					t.Fatal(err)
				}
				return d[0]
			},
			func(tx pgx.Tx) bool { // the many-partition statement
				other := cl
				other.Partition, other.MessageID = 1, "x"
				d, err := s.ClaimBatchTx(ctx, tx, []dedup.Claim{cl, other})
				if err != nil {
					t.Fatal(err)
				}
				return d[0]
			},
		} {
			inTx(t, db.Pool, func(tx pgx.Tx) {
				if !again(tx) {
					t.Fatalf("claim of %q again was not a duplicate", c.id)
				}
			})
		}
		if ok, err := s.Processed(ctx, db.Pool, "billing", c.id); err != nil || !ok {
			t.Fatalf("Processed(%q) = %v, %v; want true", c.id, ok, err)
		}
	}
	// The ID comes back as it was given.
	var back string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(message_id, message_uuid::text) FROM `+
		db.Table(migrate.ProcessedMessagesDefault)+` WHERE message_uuid IS NOT NULL AND kafka_offset = 0`).Scan(&back); err != nil || back != id {
		t.Fatalf("stored uuid reads back as %q, %v; want %q", back, err, id)
	}
	if ok, err := s.Processed(ctx, db.Pool, "shipping", id); err != nil || ok {
		t.Fatalf("Processed by another consumer = %v, %v; want false", ok, err)
	}
}

// A UUID in a batch with text IDs and with itself: the first occurrence
// claims, the answers line up with the claims.
func TestBatchMixesUUIDAndTextIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	u1, u2 := "1111abcd-2222-4333-8444-555555555555", "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if claim(t, s, tx, dedup.Claim{Consumer: "c", MessageID: u2, Topic: "t", Offset: 1}) {
			t.Fatal("first claim of u2 was a duplicate")
		}
	})
	for _, partitions := range []int{1, 2} {
		consumer := "one"
		if partitions == 2 {
			consumer = "many"
		}
		ids := []string{u1, "m", u1, u2, "M", strings.ToUpper(u1)}
		claims := make([]dedup.Claim, len(ids))
		for i, id := range ids {
			claims[i] = dedup.Claim{Consumer: consumer, MessageID: id, Topic: "t", Partition: i % partitions, Offset: int64(i)}
		}
		claims[3].Consumer = "c" // u2 was claimed by c
		var dup []bool
		inTx(t, db.Pool, func(tx pgx.Tx) {
			var err error
			if dup, err = s.ClaimBatchTx(ctx, tx, claims); err != nil {
				t.Fatal(err)
			}
		})
		want := []bool{false, false, true, true, false, false}
		if !slicesEqual(dup, want) {
			t.Fatalf("%d partition(s): duplicates %v, want %v", partitions, dup, want)
		}
		if got := storedAs(t, db, consumer, u1); got != "uuid" {
			t.Fatalf("u1 stored as %q", got)
		}
		if got := storedAs(t, db, consumer, strings.ToUpper(u1)); got != "text" {
			t.Fatalf("upper-case u1 stored as %q", got)
		}
	}
}

func slicesEqual(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Of concurrent claims of one UUID, exactly one commits as new, as with text
// IDs.
func TestConcurrentUUIDClaimsOneWins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	const id = "5d0c7a52-6f9e-4b1a-a3c4-0e9f8d7c6b5a"
	var wg sync.WaitGroup
	var fresh atomic.Int32
	start := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
			var dup bool
			if i%2 == 0 {
				dup, err = s.ClaimWithPositionTx(ctx, tx, dedup.Claim{Consumer: "c", MessageID: id, Topic: "t", Offset: int64(i)})
			} else {
				var d []bool
				d, err = s.ClaimBatchTx(ctx, tx, []dedup.Claim{{Consumer: "c", MessageID: id, Topic: "t", Offset: int64(i)}})
				if err == nil {
					dup = d[0]
				}
			}
			if err != nil {
				t.Error(err)
				return
			}
			if !dup {
				fresh.Add(1)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := fresh.Load(); n != 1 {
		t.Fatalf("%d claims committed as new, want 1", n)
	}
}
