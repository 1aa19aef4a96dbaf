package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/retry"
)

// A partition's transactions follow one another on one connection when the
// next one's messages are already fetched: the COMMIT of one, the BEGIN of
// the next and the next one's claims go to PostgreSQL in one round trip
// (commitChained), so that a transaction costs two round trips (that one,
// and the handler's statements) where it cost three. The next transaction
// is begun only once the handler of the one before succeeded, and its
// handler runs only once that one's COMMIT answered, so each message is
// still committed in a transaction of its own (BatchSize 1) and nothing
// is claimed by a transaction whose predecessor's outcome is unknown.

// chainMax bounds the transactions a worker chains in a row, keeping its
// connection and its slot of Runner.sem: then it commits on its own and
// gives both back, so that other partitions waiting for them get them.
const chainMax = 16

// chainAwayMax is how long a chained transaction may wait, open, for its
// worker (reporting the transaction before: hooks, logs) before chaining
// pauses for chainPause: slow hooks must not keep the claim and
// position-row locks of an idle transaction (which a layout switch, a
// seek or VACUUM wait for).
const (
	chainAwayMax = 20 * time.Millisecond
	chainPause   = time.Second
)

// chainBudget bounds the connections of a pool that chained transactions
// hold while their workers are away from them (reporting the transaction
// before, calling hooks): at most MaxConns-1, whatever number of runners
// share the pool, so that one connection is always free or held by work
// that ends on its own, and whatever waits for a connection of the pool
// (a hook, another runner, the outbox) gets one.
type chainBudget struct {
	held atomic.Int32
	max  func() int32 // the pool's MaxConns, read when first needed
}

// spare reports whether the budget has room now (checked before a chained
// transaction is begun; take decides once it has begun).
func (b *chainBudget) spare() bool { return b.held.Load()+1 < b.max() }

// take counts a chained transaction left open on a connection its worker
// goes away from; false when the pool has none to spare.
func (b *chainBudget) take() bool {
	limit := b.max()
	for {
		n := b.held.Load()
		if n+1 >= limit {
			return false
		}
		if b.held.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (b *chainBudget) give() { b.held.Add(-1) }

var (
	budgetsMu sync.Mutex
	budgets   = map[weak.Pointer[pgxpool.Pool]]*chainBudget{}
)

// budgetOf returns the chain budget of pool, shared by the runners on it
// (the entry goes when the pool is collected).
func budgetOf(pool *pgxpool.Pool) *chainBudget {
	key := weak.Make(pool)
	budgetsMu.Lock()
	defer budgetsMu.Unlock()
	if b := budgets[key]; b != nil {
		return b
	}
	b := &chainBudget{}
	b.max = sync.OnceValue(func() int32 {
		if p := key.Value(); p != nil {
			return p.Stat().MaxConns()
		}
		return 0
	})
	budgets[key] = b
	runtime.AddCleanup(pool, func(key weak.Pointer[pgxpool.Pool]) {
		budgetsMu.Lock()
		delete(budgets, key)
		budgetsMu.Unlock()
	}, key)
	return b
}

// claimResults are the outcomes of the claims queued by queueClaims.
type claimResults struct {
	dup        []bool // one per live message, for a claim batch
	one, moved bool   // for one message: duplicate, and whether its position row moved
	// lazy: the one message was claimed without moving the position; the
	// next transaction that claims with the position, or flushOwed, moves
	// it past (runTx).
	lazy bool
}

// chained is a transaction begun by the COMMIT of the one before it, for
// msgs, whose claims are done (res).
type chained struct {
	conn  *pgxpool.Conn
	tx    pgx.Tx
	msgs  []*Message
	res   claimResults
	begun time.Time
}

// discard rolls back and gives back a chained transaction that will not be
// used: its claims go with it.
func (c *chained) discard() {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	_ = c.tx.Rollback(ctx)
	c.conn.Release()
}

// claim is the dedup claim of m.
func (w *worker) claim(m *Message) dedup.Claim {
	return dedup.Claim{Consumer: w.r.cfg.Name, MessageID: m.ID, Topic: m.Topic, Partition: m.Partition,
		Offset: m.Offset, Time: m.Time, Epoch: w.epoch}
}

// queueClaims queues on b the claims of msgs[i] for each i in live (the
// messages handled now; parking: others of msgs wait behind a parked
// message of their key) with the partition's position; their outcomes are
// stored in res when b's results are read. lazy claims one message without
// moving the position (the transaction is chained, and the position row
// says ClaimsAhead).
func (w *worker) queueClaims(b *pgx.Batch, msgs []*Message, live []int, parking, lazy bool, res *claimResults) error {
	store := w.r.cfg.Store
	switch {
	case len(live) == 1 && !parking && lazy:
		res.lazy = true
		return store.QueueClaim(b, w.claim(msgs[0]), &res.one)
	case len(live) == 1 && !parking:
		// Two plain statements cost PostgreSQL less than the one of
		// QueueClaimWithPosition; the position row is inserted in the
		// transaction when it does not exist yet.
		return store.QueueClaimMovePosition(b, w.claim(msgs[0]), &res.one, &res.moved)
	case len(live) > 0:
		claims := make([]dedup.Claim, len(live))
		for j, i := range live {
			claims[j] = w.claim(msgs[i])
		}
		return store.QueueClaimBatch(b, claims, &res.dup)
	}
	return nil
}

// takeNext returns the chained transaction begun for msgs, or nil. One
// begun for other messages (the batch was split, or a message of it is
// parked now) is rolled back: its messages are claimed again as usual.
func (w *worker) takeNext(msgs []*Message, parking bool) *chained {
	c := w.next
	if c == nil {
		return nil
	}
	w.next = nil
	w.r.chains.give() // from here on an ordinary transaction of the worker
	if time.Since(c.begun) > chainAwayMax {
		w.chainPaused = time.Now().Add(chainPause)
	}
	if !parking && slices.Equal(c.msgs, msgs) {
		return c
	}
	c.discard()
	return nil
}

// discardNext rolls back the chained transaction, if any (the worker
// ends).
func (w *worker) discardNext() {
	if w.next != nil {
		w.next.discard()
		w.next = nil
		w.r.chains.give()
	}
}

// lookahead returns the batch fetch would return now without waiting, from
// what prefetch already fetched, or nil; fetch returns it next. Nothing is
// gathered when batches wait to fill (BatchLinger) or a held item comes
// first.
func (w *worker) lookahead() []*Message {
	if w.pending != nil {
		return w.pending
	}
	cfg := &w.r.cfg
	if w.held != nil || cfg.BatchLinger > 0 {
		return nil
	}
	var batch []*Message
	for len(batch) < cfg.BatchSize {
		m, err := w.item(context.Background(), false, nil)
		if err != nil { // none ready, or prefetch ended
			break
		}
		if m.skipTo > 0 {
			w.held = m // after the batch
			break
		}
		batch = append(batch, m)
	}
	if len(batch) > 0 {
		w.pending = batch
	}
	return w.pending
}

// chainable returns the messages whose transaction may begin with the
// COMMIT of the one of msgs, or nil: msgs must end the batch being
// processed, the next one be fetched already, every message of it have an
// ID and no key of the partition be parked.
func (w *worker) chainable(msgs []*Message) []*Message {
	switch {
	case w.chain >= chainMax,
		len(msgs) == 0 || msgs[len(msgs)-1] != w.tail,
		w.parked != nil && len(w.parked.keys) > 0,
		w.r.semWaiting.Load() > 0, // a partition waits for a slot
		time.Now().Before(w.chainPaused):
		return nil
	}
	next := w.lookahead()
	if len(next) == 0 || indexMissingID(next) >= 0 {
		return nil
	}
	if !w.r.chains.spare() {
		w.r.chainsTurnedAway.Add(1)
		return nil
	}
	return next
}

// chainLostError is the error of a transaction begun with the commit
// before whose session had ended, or ended, by the time it ran (see
// runTx): commit runs it again at once as usual, spending no attempt. A
// handler that ends its session itself meets that again in the new
// transaction, where it counts.
type chainLostError struct{ err error }

func (e *chainLostError) Error() string {
	return "consumer: the session of a transaction begun with the commit before ended: " + e.err.Error()
}

// Unwrap returns the error without its handler mark: not the handler's
// verdict.
func (e *chainLostError) Unwrap() error {
	if herr := (*handlerError)(nil); errors.As(e.err, &herr) {
		return herr.err
	}
	return e.err
}

// errNotChained means the next transaction could not be queued: commit
// on its own.
var errNotChained = errors.New("consumer: next transaction not chained")

// txSteps is what runTx runs: the messages of a transaction, the claims
// queued after its BEGIN, and its body (*txRun; a test's own steps).
type txSteps interface {
	messages() []*Message
	claims(b *pgx.Batch) error
	body(tx pgx.Tx) error
}

// runTx runs t's body in a transaction of t's messages and commits it, like
// inTx: in pre when that was begun already (its claims done), else in one
// begun with the claims t queues. When the next batch is already
// fetched, the COMMIT goes with that batch's BEGIN and claims, and its
// transaction is left in w.next, on the same connection.
func (w *worker) runTx(ctx context.Context, pre *chained, t txSteps) (err error) {
	msgs := t.messages()
	var conn *pgxpool.Conn
	var tx pgx.Tx
	if pre != nil {
		conn, tx = pre.conn, pre.tx
	} else {
		w.chain = 0
		c, err := w.r.cfg.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		b := w.newBatch()
		b.BeginTx(pgx.TxOptions{})
		if err := t.claims(b); err != nil {
			c.Release()
			return err
		}
		br := c.SendBatch(ctx, b)
		tx = br.Tx()
		err = br.Close()
		w.doneBatch()
		if err != nil {
			detached := w.bound.detach(ctx)
			dropReadOnly(detached, tx, err)
			_ = tx.Rollback(detached)
			c.Release()
			return err
		}
		conn = c
	}
	defer func() {
		if w.next == nil || w.next.conn != conn {
			conn.Release()
		}
	}()
	if pre != nil {
		// The session may have ended while the transaction waited, idle,
		// for its turn (idle_in_transaction_session_timeout while the
		// hooks before ran, a terminated backend): whatever failed on it
		// then is not the handler's verdict. (Deferred after the release
		// above, so run before it.)
		defer func() {
			if err != nil && conn.Conn().IsClosed() && !retry.IsReadOnly(err) { // 25006: closed by dropReadOnly
				err = &chainLostError{err: err}
			}
		}()
	}
	err = t.body(tx)
	// Taken once the body returned: the handler's own time (unbounded)
	// does not count against the commit's.
	detached := w.bound.detach(ctx)
	if err != nil {
		dropReadOnly(detached, tx, err)
		_ = tx.Rollback(detached)
		return err
	}
	if pc := conn.Conn(); !pc.IsClosed() && pc.PgConn().TxStatus() == 'I' {
		// The handler ended the transaction itself (tx.Rollback, a
		// ROLLBACK statement): nothing of it is committed, whatever a
		// COMMIT sent now answers (outside a transaction PostgreSQL
		// answers COMMIT, with a warning).
		_ = tx.Rollback(detached)
		return fmt.Errorf("consumer: the transaction ended before its commit: %w", pgx.ErrTxClosed)
	}
	// lazy: the transaction claimed its message without moving the
	// position; the next transaction that claims with the position, or
	// flushOwed, moves it past.
	lazy := pre != nil && pre.res.lazy && !pre.res.one
	if next := w.chainable(msgs); next != nil {
		committed, err := w.commitChained(detached, conn, tx, next)
		switch {
		case committed:
			w.owed(lazy, msgs)
			return nil
		case !errors.Is(err, errNotChained):
			w.owe = nil // see below
			return err
		}
	}
	if err := tx.Commit(detached); err != nil {
		dropReadOnly(detached, tx, err)
		_ = tx.Rollback(detached)
		// The COMMIT may have committed all the same (its answer lost):
		// moving the position past the message before would then write
		// it after this one's claim, which ClaimedAt would no longer
		// find. Left as it is, a start there finds both.
		w.owe = nil
		return err
	}
	w.owed(lazy, msgs)
	return nil
}

// newBatch returns the worker's batch, emptied: runTx and commitChained
// send one at a time, and pgx is done with a batch once its results are
// closed.
func (w *worker) newBatch() *pgx.Batch {
	w.doneBatch()
	w.batch = pgx.Batch{QueuedQueries: w.batch.QueuedQueries[:0]}
	return &w.batch
}

// doneBatch drops what the worker's batch refers to (arguments, result
// callbacks) once its results are closed, so that an idle worker keeps
// nothing of its last transaction.
func (w *worker) doneBatch() { clear(w.batch.QueuedQueries) }

// indexes returns 0, 1, …, n-1, in a slice the caller must not change.
func (w *worker) indexes(n int) []int {
	for len(w.seq) < n {
		w.seq = append(w.seq, len(w.seq))
	}
	return w.seq[:n:n]
}

// commitBound gives a worker's commits (and rollbacks) the context they
// run with: the runner's cancellation does not reach them, and they end
// within commitTimeout. A timer per transaction cost the one-message mode
// about 2% of its CPU; one deadline serves every commit that starts within
// commitBoundReuse of its making, so a commit is bounded by
// commitTimeout-commitBoundReuse to commitTimeout from when it starts
// (runTx takes it once the handler returned).
type commitBound struct {
	ctx    context.Context // a deadline alone, on context.Background
	cancel context.CancelFunc
	made   time.Time
}

// commitBoundReuse is how long a commitBound's deadline is reused: a
// thirtieth of commitTimeout (1 s).
func commitBoundReuse() time.Duration { return commitTimeout / 30 }

// detach returns a context with ctx's values (the transaction's trace)
// that ctx's cancellation does not reach and that ends at the bound's
// deadline.
func (b *commitBound) detach(ctx context.Context) context.Context {
	if now := time.Now(); b.ctx == nil || now.Sub(b.made) >= commitBoundReuse() {
		b.stop()
		b.ctx, b.cancel = context.WithTimeout(context.Background(), commitTimeout)
		b.made = now
	}
	return &boundCtx{values: ctx, bound: b.ctx}
}

// stop releases the bound's timer.
func (b *commitBound) stop() {
	if b.cancel != nil {
		b.cancel()
		b.ctx, b.cancel = nil, nil
	}
}

// boundCtx has the values of one context and the deadline and
// cancellation of another.
type boundCtx struct {
	values, bound context.Context
}

func (c *boundCtx) Deadline() (time.Time, bool) { return c.bound.Deadline() }
func (c *boundCtx) Done() <-chan struct{}       { return c.bound.Done() }
func (c *boundCtx) Err() error                  { return c.bound.Err() }

// Value looks in bound first: it holds no value of its own (it is made on
// context.Background), but it answers the context package's own lookup of
// the cancellation to follow, so that context.AfterFunc and children of
// this context register with bound rather than start a goroutine each (as
// they would for a context whose parent is not the package's own).
func (c *boundCtx) Value(key any) any {
	if v := c.bound.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// owed records what a committed transaction of msgs did to the position:
// left it behind its one message (lazy), or moved it (any other
// transaction moves it past its messages).
func (w *worker) owed(lazy bool, msgs []*Message) {
	w.owe = nil
	if lazy {
		w.owe = msgs[0]
	}
}

// ready reports whether a message is fetched and waiting for the worker.
func (w *worker) ready() bool {
	return w.pending != nil || w.held != nil || len(w.queue) > 0 || len(w.prefetched) > 0
}

// flushOwed moves the position past the message a chained claim left it
// behind (w.owe), in a short transaction of its own, when nothing follows
// that would move it: before the worker waits for messages or retries
// one, and on its way out. It commits asynchronously (synchronous_commit
// off): the position row says ClaimsAhead, so a move lost in a crash costs
// nothing but a look at the claims (checkAhead). Best effort, bounded by
// flushTimeout.
func (w *worker) flushOwed(ctx context.Context) {
	m := w.owe
	if m == nil {
		return
	}
	w.owe = nil
	cfg := &w.r.cfg
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	err := func() error {
		conn, err := cfg.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		b := &pgx.Batch{}
		b.Queue("begin")
		b.Queue("set local synchronous_commit to off")
		var moved bool
		if err := cfg.Store.QueueMovePosition(b, cfg.Name, m.Topic, m.Partition, m.Offset+1, m.Time, w.epoch, &moved); err != nil {
			return err
		}
		b.Queue("commit")
		err = conn.SendBatch(ctx, b).Close()
		if pc := conn.Conn().PgConn(); err != nil && !pc.IsClosed() && pc.TxStatus() != 'I' {
			_, _ = pc.Exec(ctx, "rollback").ReadAll()
		}
		return err
	}()
	if err != nil {
		w.log.DebugContext(ctx, "position not moved past the last transaction; a start there finds its claims",
			"offset", m.Offset, "err", err)
	}
}

// flushTimeout bounds flushOwed.
const flushTimeout = 2 * time.Second

// commitChained commits tx and, in the same round trip on its connection,
// begins the transaction of next and claims its messages. It reports
// whether tx committed, with tx's commit error when it did not
// (errNotChained: nothing was sent). When next's transaction began, it is
// w.next; when it could not, or the chain budget had no room left once it
// began (it is then rolled back), next is processed as usual. Like a commit
// alone, it runs to its end when the runner stops (ctx is detached):
// PostgreSQL answers the COMMIT only with the claims after it, so a claim
// waiting for a lock (a concurrent claim of the same ID) holds up the
// answer, and a shutdown, until the lock is released or commitTimeout.
func (w *worker) commitChained(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, next []*Message) (committed bool, err error) {
	b := w.newBatch()
	// pgx begins a batch's transaction with its first query: here that is
	// the COMMIT of tx, and the "begin" after it starts the transaction
	// the batch's Tx then stands for.
	b.BeginTx(pgx.TxOptions{BeginQuery: "commit"})
	b.QueuedQueries[0].Exec(func(tag pgconn.CommandTag) error {
		if tag.String() != "COMMIT" {
			// A transaction that failed answers COMMIT with ROLLBACK.
			return pgx.ErrTxCommitRollback
		}
		committed = true
		return nil
	})
	b.Queue("begin")
	c := &chained{msgs: next}
	res := &c.res
	live := w.indexes(len(next))
	// Claimed without the position, once the position row says claims may
	// lie past it: the next transaction claimed with the position, or
	// flushOwed, moves it past, and a runner starting after a crash in
	// between finds the claims (checkAhead).
	lazy := w.marked && len(next) == 1
	if err := w.queueClaims(b, next, live, false, lazy, res); err != nil {
		return false, errNotChained
	}
	br := conn.SendBatch(ctx, b)
	ntx := br.Tx()
	err = br.Close()
	w.doneBatch()
	if err == nil {
		// The budget counts the transactions left open while their
		// workers are away, from here on: a round trip in flight ends on
		// its own, like any transaction's. (Counted from before it, the
		// budget turned away one chain in twelve of six partitions on a
		// pool of six in the benchmark.)
		if !w.r.chains.take() {
			// Other workers took the budget's last room during the
			// round trip (spare said yes before it).
			w.r.chainsTurnedAway.Add(1)
			w.log.DebugContext(ctx, "next transaction rolled back: the pool's connections for transactions in a row are taken")
			_ = ntx.Rollback(ctx) // its messages are claimed again as usual
			return true, nil
		}
		c.conn, c.tx, c.begun = conn, ntx, time.Now()
		w.next = c
		w.chain++
		return true, nil
	}
	switch {
	case committed:
		// The next transaction did not begin or its claims failed: it
		// runs again as usual, which meets the error again and handles it.
		dropReadOnly(ctx, ntx, err)
		_ = ntx.Rollback(ctx)
		w.log.DebugContext(ctx, "next transaction not begun with the commit", "err", err)
		return true, nil
	}
	// tx did not commit. When its COMMIT answered ROLLBACK, the next
	// transaction began: roll it back.
	dropReadOnly(ctx, tx, err)
	_ = ntx.Rollback(ctx)
	return false, err
}
