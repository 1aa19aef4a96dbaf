package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/outbox"
)

// Two relays and business transactions that overlap on the same keys: some
// stay open (a slow transaction, committing late) while later ones of the
// same keys commit; keys interleave within transactions. Read back from
// Kafka: every message exactly once (by its stable ID), and per key, a
// message of a transaction that committed before another began comes
// first.
func TestTwoRelaysOverlappingTransactions(t *testing.T) {
	t.Parallel()
	const (
		writers = 6
		txs     = 40 // per writer
		keys    = 8
		perTx   = 5
	)
	ctx := context.Background()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 3)
	pub := newPublished()
	for range 2 {
		// Small batches: many rounds, pipelined and not, on both relays.
		run(t, newRelay(t, db, store, outbox.RelayConfig{BatchSize: 7, Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}}))
	}

	// A ticket clock shared by the writers: a transaction's begin ticket is
	// taken before BEGIN, its commit ticket after COMMIT returned, so
	// commit(a) < begin(b) means a committed before b began.
	var clock atomic.Int64
	type txInfo struct{ begin, commit int64 }
	var (
		mu    sync.Mutex
		infos []txInfo
		msgTx = map[string]int{} // message ID → transaction
		pos   = map[string]int{} // message ID → position in its transaction
		ids   []string
	)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 15))
			for range txs {
				begin := clock.Add(1)
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				msgs := make([]outbox.Message, perTx)
				for j := range msgs {
					msgs[j] = outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", rng.IntN(keys)),
						Value: fmt.Appendf(nil, "w%d", w)}
				}
				got, err := store.EnqueueTx(ctx, tx, msgs...)
				if err == nil && rng.IntN(5) == 0 {
					// A slow transaction: later ones of its keys commit first.
					time.Sleep(time.Duration(50+rng.IntN(150)) * time.Millisecond)
				}
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
				if err != nil {
					t.Error(err)
					return
				}
				commit := clock.Add(1)
				mu.Lock()
				infos = append(infos, txInfo{begin, commit})
				for j, id := range got {
					msgTx[id], pos[id] = len(infos)-1, j
					ids = append(ids, id)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	pub.wait(t, time.Minute, ids...)

	msgs := readAll(t, testenv.Brokers(t), topic)
	seen := map[string]int{}
	order := map[string][]string{} // key → first deliveries in order
	for _, m := range msgs {
		id := header(m, outbox.HeaderID)
		if _, ok := msgTx[id]; !ok {
			t.Fatalf("unknown message %q in Kafka", id)
		}
		if seen[id]++; seen[id] == 1 {
			order[string(m.Key)] = append(order[string(m.Key)], id)
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("message %s delivered %d times, want exactly once", id, seen[id])
		}
	}
	// Per key: no message comes after one that must follow it.
	violations := 0
	for key, list := range order {
		for i := range list {
			for j := i + 1; j < len(list); j++ {
				a, b := list[i], list[j] // a delivered before b
				ta, tb := msgTx[a], msgTx[b]
				switch {
				case ta == tb && pos[a] > pos[b]:
					t.Errorf("key %s: %s delivered before %s, enqueued before it in one transaction", key, b, a)
					violations++
				case ta != tb && infos[tb].commit < infos[ta].begin:
					t.Errorf("key %s: %s delivered before %s, whose transaction committed before its own began", key, a, b)
					violations++
				}
				if violations > 10 {
					t.FailNow()
				}
			}
		}
	}
	t.Logf("%d messages in %d transactions over %d keys, each delivered once, in order", len(ids), len(infos), len(order))
}

// heldShards returns, per backend, how many shards of the store's table
// relays hold (session advisory locks on two keys, the second a shard).
func heldShards(t *testing.T, db *testenv.DB, store *outbox.Store) map[int32]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT pid, count(*)::int FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND objid < 64
  AND classid = ($1::int::bigint & 4294967295)::oid
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY pid`, outbox.ShardNamespace(store))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int{}
	var pid int32
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&pid, &n}, func() error {
		out[pid] = n
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitShards waits until the relays hold the given numbers of shards.
func waitShards(t *testing.T, db *testenv.DB, store *outbox.Store, want ...int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := heldShards(t, db, store)
		counts := map[int]int{}
		for _, n := range got {
			counts[n]++
		}
		wantCounts := map[int]int{}
		for _, n := range want {
			wantCounts[n]++
		}
		if fmt.Sprint(counts) == fmt.Sprint(wantCounts) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relays hold shards %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Shard leases: one relay holds every shard; a second one gets half of
// them; when the first stops, the second takes them all, and publishes the
// keys of both halves.
func TestRelaysShareShards(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 2)
	pub := newPublished()
	stopA := run(t, newRelay(t, db, store, outbox.RelayConfig{Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}}))
	waitShards(t, db, store, 64)
	run(t, newRelay(t, db, store, outbox.RelayConfig{Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}}))
	waitShards(t, db, store, 32, 32)
	stopA()
	waitShards(t, db, store, 64)
	var msgs []outbox.Message
	for i := range 200 {
		msgs = append(msgs, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")})
	}
	pub.wait(t, 30*time.Second, enqueue(t, db.Pool, store, msgs...)...)
}

// Wake-ups coalesce: a burst of commits, each with its NOTIFY, while the
// relay waits WakeDelay after the first, costs one round (two at most, if
// a notification arrives during that round), not one per commit.
func TestBurstOfCommitsCostsOneRound(t *testing.T) {
	t.Parallel()
	const burst = 30
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 1)
	pub := newPublished()
	r := newRelay(t, db, store, outbox.RelayConfig{WakeDelay: 2 * time.Second, PollInterval: time.Hour,
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}})
	var rounds atomic.Int64
	outbox.OnRound(r, func(int) { rounds.Add(1) })
	run(t, r)
	// The relay is up and idle once a first message went through.
	pub.wait(t, 30*time.Second, enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Key: []byte("first")})...)
	rounds.Store(0)
	var ids []string
	for i := range burst {
		ids = append(ids, enqueue(t, db.Pool, store,
			outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%3), Value: fmt.Appendf(nil, "%d", i)})...)
	}
	pub.wait(t, 30*time.Second, ids...)
	if n := rounds.Load(); n > 2 {
		t.Fatalf("a burst of %d commits cost %d rounds, want 1 (2 at most)", burst, n)
	}
}

// A failure in a full batch: the pipelined round rolls back the transaction
// that marked the batch published and read behind it, writes the true
// outcome, and goes on. A message too large for MaxBatchBytes is dead,
// the later messages of its key are dead behind it, every other message
// is published once, in order.
func TestFailureInFullBatch(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 2)
	pub := newPublished()
	dead := make(chan outbox.Record, 1)
	run(t, newRelay(t, db, store, outbox.RelayConfig{BatchSize: 4, MaxBatchBytes: 4096,
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook, OnDead: func(rec outbox.Record, _ error) { dead <- rec }}}}))
	var msgs []outbox.Message
	want := map[string]int{}
	for i := range 40 {
		key := fmt.Sprintf("k%d", i%4)
		msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s/%d", key, want[key])})
		want[key]++
	}
	// The poison: key "p", first of its key, with two behind it.
	poison := outbox.Message{Topic: topic, Key: []byte("p"), Value: make([]byte, 5000)}
	msgs = append(msgs[:10], append([]outbox.Message{poison,
		{Topic: topic, Key: []byte("p"), Value: []byte("p/1")}}, msgs[10:]...)...)
	msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte("p"), Value: []byte("p/2")})
	ids := enqueue(t, db.Pool, store, msgs...)
	var good []string
	for i, id := range ids {
		if string(msgs[i].Key) != "p" {
			good = append(good, id)
		}
	}
	pub.wait(t, 30*time.Second, good...)
	select {
	case rec := <-dead:
		if rec.ID != ids[10] {
			t.Fatalf("dead %s, want the poison %s", rec.ID, ids[10])
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the poison did not die")
	}
	waitBacklog(t, db, store, 30*time.Second)
	ps, err := store.Dead(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 || ps[1].BlockedBy != ids[10] || ps[2].BlockedBy != ids[10] {
		t.Fatalf("dead: %+v, want the poison and the two behind it", ps)
	}
	dups := checkKeyOrder(t, readAll(t, testenv.Brokers(t), topic), want)
	if dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}
