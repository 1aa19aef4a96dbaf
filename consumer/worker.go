package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/retry"
)

// worker processes one partition for one generation, in offset order.
type worker struct {
	r           *Runner
	commits     *committer
	parked      *parker // when the partition has parked messages, or in NonBlocking mode
	partition   int
	start       int64
	incarnation int64
	epoch       int64 // of the position at assignment: position writes require it
	budget      int64 // bytes of messages fetched ahead of the handler
	fail        func(error)
	log         *slog.Logger
	outage      *outage.Waiter

	prefetched chan []*Message // chunks of items, filled by prefetch, bounded by budget
	queue      []*Message      // the rest of the chunk last received from prefetched
	held       *Message        // an item taken from prefetched for the next batch
	bytes      *byteBudget
	state      *partitionState // what Runner.Partitions reports
	// lockWait is how long the claims of the last transaction waited for
	// another session's lock, when they were found waiting (see runTx).
	lockWait time.Duration
	batch    pgx.Batch // the batch that begins a transaction, reused (runTx)
	locks    pgsession.LockWatch
	// events are the observers' events, reused: an event is valid during
	// the call only.
	events struct {
		start   TxStartEvent
		end     TxEndEvent
		outcome OutcomeEvent
	}
}

func (w *worker) run(runCtx, genCtx context.Context) {
	// ctx ends with the run or with the generation (a rebalance), whichever
	// comes first; a transaction in flight then rolls back.
	ctx, stop := context.WithCancel(runCtx)
	defer stop()
	defer context.AfterFunc(genCtx, stop)()

	cfg := &w.r.cfg
	w.state = newPartitionState(w.partition, w.start)
	w.r.states.add(w.state)
	defer w.r.states.remove(w.state)
	w.outage = w.r.pgWaiter(fmt.Sprintf("postgres partition %d", w.partition))
	defer w.outage.Stop() // a rebalance may end the worker in an outage
	// Each partition has its own connections: a broker answers the
	// requests of one connection in turn, and a fetch waiting for records
	// must not hold up another partition's.
	client, closeClient, err := w.r.client()
	if err != nil { // Config.Kafka was validated by New: not expected
		w.fail(err)
		return
	}
	defer closeClient()
	reader, err := kread.New(&kread.Config{Client: client, Topic: cfg.Topic, Partition: w.partition,
		MinBytes: 1, MaxBytes: firstFetchBytes(w.budget), MaxWait: 250 * time.Millisecond}, w.start)
	if err != nil {
		w.fail(fmt.Errorf("consumer: partition %d: %w", w.partition, err))
		return
	}
	w.log.Debug("partition assigned", "start_offset", w.start, "incarnation", w.incarnation)
	if err := w.loadParked(ctx); err != nil {
		if ctx.Err() == nil {
			w.fail(err)
		}
		return
	}

	w.bytes = newByteBudget(w.budget)
	w.prefetched = make(chan []*Message, max(4, (2*cfg.BatchSize+chunkMax-1)/chunkMax))
	var prefetchDone sync.WaitGroup
	prefetchDone.Go(func() { w.prefetch(ctx, reader) })
	defer prefetchDone.Wait()
	defer stop() // prefetch ends before the client closes

	for {
		if w.parked != nil {
			if err := w.untilReachable(ctx, w.parked.releaseDue); err != nil {
				if ctx.Err() == nil {
					w.fail(err)
				}
				return
			}
		}
		batch, err := w.fetch(ctx)
		if errors.Is(err, errIdle) {
			continue // time to look at parked messages
		}
		if err != nil {
			return // the run or the generation ended
		}
		if skip := batch[0].skipTo; skip > 0 {
			// Only transaction markers or records of aborted transactions
			// lie before skip: the position moves past them.
			if err := w.advance(ctx, skip); err != nil {
				if ctx.Err() == nil {
					w.fail(err)
				}
				return
			}
			continue
		}
		if err := w.acquire(ctx); err != nil {
			return
		}
		err = w.untilReachable(ctx, func(ctx context.Context) error { return w.process(ctx, batch) })
		<-w.r.sem
		w.bytes.release(batchBytes(batch))
		if err != nil {
			if ctx.Err() == nil {
				w.fail(err)
			}
			return
		}
		// The transaction committed: the offset may now go to Kafka.
		w.moved(batch[len(batch)-1].Offset + 1)
	}
}

// moved records that every message before next is committed in
// PostgreSQL: for the Kafka offset commit and Runner.Partitions.
func (w *worker) moved(next int64) {
	w.commits.mark(w.partition, next)
	w.state.moved(next)
}

// untilReachable runs op again after a connection error it returns, waiting
// the outage out, so that a lost connection between the steps of op (which
// each wait out their own transactions' outages) does not stop the runner.
// A verdict is returned at once, whatever error it wraps: a message that
// failed for good (*MessageError), an error of OnFailure, an outage that
// outlasted MaxOutage.
func (w *worker) untilReachable(ctx context.Context, op func(ctx context.Context) error) error {
	for {
		err := op(ctx)
		if err == nil {
			return nil
		}
		var merr *MessageError
		var verdict *verdictError
		if errors.As(err, &merr) || errors.As(err, &verdict) {
			return err
		}
		if werr := w.outage.Wait(ctx, err); werr != nil {
			return werr
		}
	}
}

// verdictError marks an error that is an answer, not an outage, whatever it
// wraps: an error OnFailure returned.
type verdictError struct{ err error }

func (e *verdictError) Error() string { return e.err.Error() }
func (e *verdictError) Unwrap() error { return e.err }

// firstFetchBytes bounds a partition's first fetch, before the size its
// messages decode to is known: an eighth of its share of
// MaxBufferedBytes (small messages decode to up to about eight times their
// size on the wire), between 16 KiB and 1 MiB. Later fetches are sized by
// nextFetchBytes. Kafka returns a record batch larger than the bound
// whole, so a large message still comes.
func firstFetchBytes(budget int64) int {
	return int(min(max(budget/8, 16<<10), 1<<20))
}

// recordWireBytes estimates what a record costs on the wire besides its
// key, value and headers (offset and length varints, attributes, the
// header count): for the ratio of a fetch's decoded size to its size on
// the wire.
const recordWireBytes = 16

// nextFetchBytes sizes the next fetch of a partition whose share of
// MaxBufferedBytes is budget, from the last fetch: its records counted
// decoded bytes (messageBytes: MessageOverhead each) for wire estimated
// bytes on the wire. A fetch's records are held decoded until the last of
// them is handed on, so the fetch asks for what decodes to about half the
// share: small messages decode to several times their size on the wire,
// and a fetch sized on the wire alone held several times the budget. Kafka
// returns a record batch larger than the bound whole.
func nextFetchBytes(budget, decoded, wire int64) int {
	if decoded <= 0 || wire <= 0 {
		return firstFetchBytes(budget)
	}
	n := budget / 2 * wire / decoded
	return int(min(max(n, 16<<10), 4<<20))
}

// loadParked makes the partition's parker: always in NonBlocking mode, and
// in Blocking mode when messages parked by an earlier NonBlocking run are
// still waiting, so that they are released (in order, before later messages
// of their keys) instead of stranded behind the position.
func (w *worker) loadParked(ctx context.Context) error {
	p := newParker(w)
	if err := w.outage.Do(ctx, p.load); err != nil {
		return err
	}
	if w.r.cfg.FailureMode == NonBlocking || len(p.keys) > 0 {
		w.parked = p
	}
	if w.r.cfg.FailureMode == Blocking && len(p.keys) > 0 {
		n := 0
		for _, c := range p.keys {
			n += c
		}
		w.log.Warn("messages parked by an earlier NonBlocking run are waiting; releasing them before later messages of their keys",
			"parked", n, "keys", len(p.keys))
	}
	return nil
}

// prefetch moves the partition's committed messages into w.prefetched,
// holding at most w.budget bytes of messages not yet processed (at least
// one). When a fetch ends with records no handler sees (transaction markers,
// records of aborted transactions), it sends an item that moves the
// position past them, so that the position and Kafka's offset reach the log
// end. A partition held back by an open transaction is reported.
func (w *worker) prefetch(ctx context.Context, reader *kread.Reader) {
	defer close(w.prefetched)
	cfg := &w.r.cfg
	fetches := w.r.waiter(fmt.Sprintf("kafka fetch partition %d", w.partition))
	defer fetches.Stop()
	sent := w.start // the offset after the last item sent
	var heldSince time.Time
	heldReported := false
	for {
		var f kread.Fetch
		err := fetches.Do(ctx, func(ctx context.Context) error {
			var err error
			f, err = reader.Fetch(ctx)
			return err
		})
		if err != nil {
			var oor *kread.OffsetOutOfRangeError
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, retry.ErrOutage):
				w.fail(err)
			case kafkaconn.Classify(err) != nil:
				// Refused credentials or TLS: no retry changes them.
				w.fail(fmt.Errorf("consumer: fetch %s/%d: %w", w.r.cfg.Topic, w.partition, w.r.cfg.Kafka.Wrap(err)))
			case errors.As(err, &oor):
				// Records were deleted under the consumer (retention), or the
				// topic changed: leaving the generation makes the partition
				// start again from its checked position, which reports it.
				w.log.Error("fetch offset out of range; leaving the generation to check the position again", "err", err)
			default:
				w.log.Error("fetch failed; leaving the generation", "err", err)
			}
			return
		}
		begin := f.Next
		if len(f.Records) > 0 {
			begin = f.Records[0].Offset
		}
		w.state.started(begin)
		// Items go to the worker in chunks: one hand-over (and wake-up)
		// per chunk, not per message.
		var decoded, wire int64
		var chunk []*Message
		flush := func() bool {
			if len(chunk) == 0 {
				return true
			}
			ok := w.send(ctx, chunk)
			chunk = nil
			return ok
		}
		for i, m := range f.Records {
			if chunk == nil {
				chunk = make([]*Message, 0, min(chunkMax, len(f.Records)-i+1)) // +1: a skip item may follow
			}
			msg := w.message(m)
			msg.size = messageBytes(msg)
			decoded += msg.size
			wire += msg.size - MessageOverhead + recordWireBytes
			if !w.bytes.tryAcquire(msg.size) {
				// The worker frees budget only as it handles what it has:
				// hand over the chunk before waiting for it.
				if !flush() || !w.bytes.acquire(ctx, msg.size) {
					return
				}
			}
			chunk = append(chunk, msg)
			if len(chunk) == chunkMax && !flush() {
				return
			}
			sent = m.Offset + 1
		}
		if len(f.Records) > 0 {
			reader.SetMaxBytes(nextFetchBytes(w.budget, decoded, wire))
		}
		if f.Next > sent && f.Next > 0 {
			chunk = append(chunk, &Message{skipTo: f.Next})
			sent = f.Next
		}
		if !flush() {
			return
		}
		// An open transaction holds the partition at its first offset:
		// nothing after it can be read until it ends.
		w.state.observeEnds(f.LastStable, f.HighWatermark)
		held := len(f.Records) == 0 && f.LastStable < f.HighWatermark && f.Next >= f.LastStable
		switch {
		case held && heldSince.IsZero():
			heldSince = time.Now()
		case held && !heldReported && time.Since(heldSince) >= cfg.HeldWarnAfter:
			heldReported = true
			w.log.Warn("partition held at the last stable offset by an open transaction; records after it wait until it commits or aborts",
				"last_stable", f.LastStable, "high_watermark", f.HighWatermark, "held", time.Since(heldSince).Round(time.Second))
			w.r.obs.heldBack(ctx, &HeldEvent{Topic: cfg.Topic, Partition: w.partition, LastStable: f.LastStable,
				HighWatermark: f.HighWatermark, Held: time.Since(heldSince)})
		case !held && !heldSince.IsZero():
			if heldReported {
				w.log.Info("partition released by the open transaction", "held", time.Since(heldSince).Round(time.Second))
			}
			heldSince, heldReported = time.Time{}, false
		}
	}
}

// chunkMax is the most items prefetch hands over at once.
const chunkMax = 128

func (w *worker) send(ctx context.Context, chunk []*Message) bool {
	select {
	case w.prefetched <- chunk:
		return true
	case <-ctx.Done():
		return false
	}
}

var (
	// errNoItem: no item was ready (or came before the timeout).
	errNoItem = errors.New("no item")
	// errPrefetchEnded: prefetch ended; no item will come.
	errPrefetchEnded = errors.New("prefetch ended")
)

// item takes the next item prefetch handed over: at once, or (block) when
// one comes, until timeout fires (nil: never) or ctx ends.
func (w *worker) item(ctx context.Context, block bool, timeout <-chan time.Time) (*Message, error) {
	if len(w.queue) == 0 {
		var chunk []*Message
		var ok bool
		if block {
			select {
			case chunk, ok = <-w.prefetched:
			case <-timeout:
				return nil, errNoItem
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			select {
			case chunk, ok = <-w.prefetched:
			default:
				return nil, errNoItem
			}
		}
		if !ok {
			return nil, errPrefetchEnded
		}
		w.queue = chunk
	}
	m := w.queue[0]
	w.queue[0] = nil
	w.queue = w.queue[1:]
	return m, nil
}

// advance moves the partition's position to next (past records no handler
// sees) in its own transaction, keeping the last anchor, and lets the
// offset go to Kafka.
func (w *worker) advance(ctx context.Context, next int64) error {
	cfg := &w.r.cfg
	err := w.outage.Do(ctx, func(ctx context.Context) error {
		return inTx(ctx, cfg.pool, 0, func(ctx context.Context, tx pgx.Tx) error {
			return cfg.Store.SavePositionTx(ctx, tx, cfg.Name, cfg.Topic, w.partition, next, time.Time{}, w.epoch)
		})
	})
	if err != nil {
		return fmt.Errorf("consumer: partition %d: move the position past transaction markers: %w", w.partition, err)
	}
	w.moved(next)
	return nil
}

// messageBytes is what a message counts against the buffer budget.
func messageBytes(m *Message) int64 {
	n := int64(MessageOverhead + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// batchBytes is what msgs acquired from the budget when they were fetched
// (not recomputed: a handler or middleware may change a message).
func batchBytes(msgs []*Message) int64 {
	var n int64
	for _, m := range msgs {
		n += m.size
	}
	return n
}

// byteBudget bounds the bytes of messages in flight; one message is always
// let through, whatever its size.
type byteBudget struct {
	mu    sync.Mutex
	limit int64
	used  int64
	freed chan struct{} // size 1: bytes were released
}

func newByteBudget(limit int64) *byteBudget {
	return &byteBudget{limit: limit, freed: make(chan struct{}, 1)}
}

// tryAcquire is acquire without waiting: false when n does not fit now.
func (b *byteBudget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used == 0 || b.used+n <= b.limit {
		b.used += n
		return true
	}
	return false
}

func (b *byteBudget) acquire(ctx context.Context, n int64) bool {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			return true
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-ctx.Done():
			return false
		}
	}
}

func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	b.used = max(b.used-n, 0)
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

func (w *worker) acquire(ctx context.Context) error {
	select {
	case w.r.sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case w.r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errIdle means no message came while parked messages may be due.
var errIdle = errors.New("idle")

// fetch waits for one message, then gathers up to BatchSize-1 more: those
// already fetched, or (BatchLinger > 0) those that come within BatchLinger.
// With parked messages it waits at most ParkedPoll and returns errIdle.
func (w *worker) fetch(ctx context.Context) ([]*Message, error) {
	cfg := &w.r.cfg
	var poll <-chan time.Time
	if w.parked != nil && len(w.parked.keys) > 0 {
		t := time.NewTimer(cfg.ParkedPoll)
		defer t.Stop()
		poll = t.C
	}
	var first *Message
	if w.held != nil {
		first, w.held = w.held, nil
	} else {
		m, err := w.item(ctx, true, poll)
		switch {
		case errors.Is(err, errNoItem):
			return nil, errIdle
		case err != nil:
			return nil, err
		}
		first = m
	}
	batch := []*Message{first}
	if cfg.BatchSize == 1 || first.skipTo > 0 {
		return batch, nil
	}
	var linger <-chan time.Time // nil: take what is already fetched, wait for nothing
	if cfg.BatchLinger > 0 {
		t := time.NewTimer(cfg.BatchLinger)
		defer t.Stop()
		linger = t.C
	}
	for len(batch) < cfg.BatchSize {
		m, err := w.item(ctx, linger != nil, linger)
		switch {
		case errors.Is(err, errNoItem), errors.Is(err, errPrefetchEnded):
			return batch, nil
		case err != nil:
			return nil, err
		case m.skipTo > 0:
			w.held = m // after this batch
			return batch, nil
		}
		batch = append(batch, m)
	}
	return batch, nil
}

// message wraps a Kafka message and extracts its ID; an empty ID means none
// was usable (process fails such a message with ErrMissingID).
func (w *worker) message(m kafka.Message) *Message {
	cfg := &w.r.cfg
	msg := &Message{Message: m, Incarnation: w.incarnation}
	var id string
	found := false
	if cfg.IDFunc != nil {
		var err error
		// &msg.Message, not &m: m would escape to the heap, a second
		// copy of every message.
		if id, err = callIDFunc(cfg.IDFunc, &msg.Message); err != nil {
			msg.idErr = fmt.Errorf("%w: IDFunc: %w", ErrMissingID, err)
			id = ""
		}
	} else {
		for _, h := range m.Headers {
			if h.Key == cfg.IDHeader {
				id, found = string(h.Value), true
				break
			}
		}
	}
	if id == "" && cfg.MissingID == MissingIDUseCoordinates {
		id = CoordinateID(m.Topic, m.Partition, m.Offset, w.incarnation)
	}
	switch err := dedup.ValidateID("message ID", id); {
	case id == "" && msg.idErr == nil && found:
		msg.idErr = fmt.Errorf("%w: the %q header is empty", ErrMissingID, cfg.IDHeader)
	case id == "" && msg.idErr == nil:
		msg.idErr = fmt.Errorf("%w: no %q header", ErrMissingID, cfg.IDHeader)
	case id != "" && err != nil:
		msg.idErr = fmt.Errorf("%w: %w", ErrMissingID, err)
	case id != "":
		msg.ID = id
	}
	return msg
}

// CoordinateID is the message ID MissingIDUseCoordinates derives for the
// record at offset of topic's partition: "topic/partition/offset" for the
// topic's first incarnation, "topic/partition/offset#N" for its N-th
// recreation (see Message.Incarnation), so that the records of a topic that
// was deleted and created again never take the IDs of the old ones.
func CoordinateID(topic string, partition int, offset, incarnation int64) string {
	id := topic + "/" + strconv.Itoa(partition) + "/" + strconv.FormatInt(offset, 10)
	if incarnation > 0 {
		id += "#" + strconv.FormatInt(incarnation, 10)
	}
	return id
}

// process commits the effects of msgs. When a handler fails, the messages
// before the failure commit together, the failing one is retried alone under
// the retry policy, and the rest continue: a failure neither undoes nor
// blocks the others' effects.
func (w *worker) process(ctx context.Context, msgs []*Message) error {
	for len(msgs) > 0 {
		// A message without a usable ID is never processed without dedup.
		if i := indexMissingID(msgs); i >= 0 {
			if err := w.process(ctx, msgs[:i]); err != nil {
				return err
			}
			now := time.Now()
			f := failure{attempts: 1, class: retry.ClassPermanent, first: now, last: now, err: msgs[i].idErr}
			if err := w.giveUp(ctx, msgs[i], f, true); err != nil {
				return err
			}
			msgs = msgs[i+1:]
			continue
		}
		failed, tctx, err := w.commit(ctx, msgs, 1)
		if err == nil {
			return nil
		}
		if errors.Is(err, errSplit) {
			half := len(msgs) / 2
			if err := w.process(ctx, msgs[:half]); err != nil {
				return err
			}
			msgs = msgs[half:]
			continue
		}
		if failed < 0 || ctx.Err() != nil {
			return err
		}
		if len(msgs) == 1 {
			return w.retry(ctx, tctx, msgs[0], err)
		}
		// Commit what came before the failure, isolate the failure, go on.
		// A batch handler does not say which message failed: split in halves.
		if w.r.cfg.BatchHandler != nil && !errors.Is(err, ErrBeyondHorizon) {
			failed = len(msgs) / 2
			if err := w.process(ctx, msgs[:failed]); err != nil {
				return err
			}
			msgs = msgs[failed:]
			continue
		}
		if err := w.process(ctx, msgs[:failed]); err != nil {
			return err
		}
		if err := w.retry(ctx, tctx, msgs[failed], err); err != nil {
			return err
		}
		msgs = msgs[failed+1:]
	}
	return nil
}

func indexMissingID(msgs []*Message) int {
	for i, m := range msgs {
		if m.ID == "" {
			return i
		}
	}
	return -1
}

// retry runs one failing message again under the retry policy until it
// succeeds, its error proves permanent, or the schedule is used up. tctx is
// the context of the transaction that failed (its TxStart's): logs and
// observers of the failure get it, so that they carry its trace.
func (w *worker) retry(ctx, tctx context.Context, msg *Message, err error) error {
	cfg := &w.r.cfg
	schedule := cfg.Retry.Schedule()
	f := failure{first: time.Now(), ctx: tctx}
	for f.attempts = 1; ; f.attempts++ {
		f.last, f.err = time.Now(), err
		if herr := (*HorizonError)(nil); errors.As(err, &herr) {
			// Not the handler's failure: the message was never applied.
			// Retrying cannot make it younger, and parking it would only
			// make it older.
			f.class = retry.ClassPermanent
			w.log.WarnContext(f.logCtx(ctx), "message beyond the dedup horizon; not applied", "offset", msg.Offset,
				"message_id", msg.ID, "age", herr.Age, "horizon", herr.Horizon)
			return w.giveUp(ctx, msg, f, true)
		}
		f.class = cfg.Retry.Classify(err)
		switch f.class {
		case retry.ClassStop:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			f.class = retry.ClassTransient // a handler's own timeout: retry it
		case retry.ClassPermanent:
			return w.giveUp(ctx, msg, f, true)
		}
		delay, ok := schedule.Next()
		if !ok {
			if w.parked != nil && cfg.FailureMode == NonBlocking {
				return w.parked.park(ctx, msg, f)
			}
			return w.giveUp(ctx, msg, f, true)
		}
		w.log.WarnContext(f.ctx, "handler failed; retrying", "offset", msg.Offset, "message_id", msg.ID,
			"attempt", f.attempts, "delay", delay, "err", err)
		w.r.obs.retried(f.ctx, &RetryEvent{Message: msg, Attempt: f.attempts, Err: err, Class: f.class, Delay: delay})
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		var failed int
		if failed, f.ctx, err = w.commit(ctx, []*Message{msg}, f.attempts+1); err == nil {
			return nil
		}
		if failed < 0 || ctx.Err() != nil {
			return err
		}
	}
}

// failure is a message's failure history.
type failure struct {
	attempts    int
	class       retry.Class
	first, last time.Time
	err         error
	// ctx is the context of the last failed transaction (its TxStart's,
	// with its trace) for logs; nil when the failure had none.
	ctx context.Context
}

// logCtx is the context the failure's logs are written with.
func (f *failure) logCtx(ctx context.Context) context.Context {
	if f.ctx != nil {
		return f.ctx
	}
	return ctx
}

// giveUp hands a message that failed for good to OnFailure and, when that
// took it, records the partition's position past it (when savePosition; a
// parked message is already behind the position) so that it is not fetched
// again. Without OnFailure the runner stops.
func (w *worker) giveUp(ctx context.Context, msg *Message, f failure, savePosition bool) error {
	cfg := &w.r.cfg
	merr := &MessageError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, ID: msg.ID,
		Attempts: f.attempts, Class: f.class, FirstFailure: f.first, LastFailure: f.last, Err: f.err}
	log := w.log.With("offset", msg.Offset, "message_id", msg.ID, "attempts", f.attempts, "class", f.class, "err", f.err)
	lctx := f.logCtx(ctx)
	if perr := (*idemkit.PanicError)(nil); errors.As(f.err, &perr) {
		log = log.With("stack", string(perr.Stack))
	}
	if cfg.OnFailure == nil {
		log.ErrorContext(lctx, "message failed for good; stopping (no OnFailure)")
		return merr
	}
	log.WarnContext(lctx, "message failed for good; handing it to OnFailure")
	if ferr := callOnFailure(ctx, cfg.OnFailure, msg, merr); ferr != nil {
		return &verdictError{fmt.Errorf("consumer: OnFailure for %s/%d/%d: %w", msg.Topic, msg.Partition, msg.Offset, ferr)}
	}
	if savePosition {
		// OnFailure took the message: wait out an outage here rather than
		// hand the message to OnFailure a second time.
		err := w.outage.Do(ctx, func(ctx context.Context) error {
			return inTx(ctx, cfg.pool, 0, func(ctx context.Context, tx pgx.Tx) error {
				return cfg.Store.SavePositionTx(ctx, tx, cfg.Name, msg.Topic, msg.Partition, msg.Offset+1, msg.Time, w.epoch)
			})
		})
		if err != nil {
			return fmt.Errorf("consumer: save position past failed message: %w", err)
		}
	}
	if len(w.r.obs.outcome) > 0 {
		e := &OutcomeEvent{Message: msg, Outcome: Failed, Err: merr}
		_ = errors.As(f.err, &e.Horizon)
		w.r.obs.outcomeOf(lctx, e)
	}
	return nil
}

// commit runs msgs in one transaction: claim every ID and record the
// position in one statement, run the handler for the new ones, commit.
// attempt is the handler attempt (from 1) for TxStartEvent.
// On a handler error it returns the index of the failing message (0 for a
// batch handler); on any other error, -1. Serialization failures and
// deadlocks run the transaction again.
func (w *worker) commit(ctx context.Context, msgs []*Message, attempt int) (failed int, tctx context.Context, err error) {
	layoutWaits := 0
	for try := 1; ; try++ {
		failed, _, tctx, err = w.observedTx(ctx, msgs, attempt)
		if err == nil {
			w.outage.Ok()
			return -1, tctx, nil
		}
		if failed < 0 && len(msgs) > 1 && (errors.Is(err, dedup.ErrNoPartition) || errors.Is(err, dedup.ErrPartitionDropped)) {
			// One of the claims has no daily partition: find it alone.
			w.r.askMaintenance()
			return -1, tctx, errSplit
		}
		if failed < 0 && (errors.Is(err, dedup.ErrLayoutChanged) || errors.Is(err, dedup.ErrLayoutUnknown)) && ctx.Err() == nil {
			// The dedup layout changed under the claims (the store reads it
			// again), or a switch to the daily layout is in progress and
			// refuses them until it is done: wait, with backoff, and run the
			// same transaction again. Not the messages' fault: no attempt
			// is spent.
			layoutWaits++
			if layoutWaits == 2 {
				w.log.WarnContext(tctx, "dedup layout switch in progress: waiting to claim", "err", err)
			}
			t := time.NewTimer(min(5*time.Millisecond<<min(layoutWaits, 10), 2*time.Second))
			select {
			case <-ctx.Done():
				t.Stop()
				return -1, tctx, ctx.Err()
			case <-t.C:
			}
			try = 0
			continue
		}
		if failed < 0 && retry.IsConnection(err) && ctx.Err() == nil {
			// An outage, not a verdict on the messages: wait it out and run
			// the same transaction again. An ambiguous commit is settled by
			// the claims: what committed comes back as duplicates.
			if werr := w.outage.Wait(ctx, err); werr != nil {
				return -1, tctx, werr
			}
			if len(msgs) > 1 {
				// Run it again in halves: a batch longer than the time
				// between two losses would otherwise never commit.
				return -1, tctx, errSplit
			}
			try = 0
			continue
		}
		if !retryableTx(err) || try >= txRetries || ctx.Err() != nil {
			return failed, tctx, err
		}
		w.log.DebugContext(tctx, "transaction conflict; running it again", "try", try, "err", err)
	}
}

// observedTx runs tx between the TxObservers' TxStart and TxEnd, and
// reports the outcomes of a committed transaction to the OutcomeObservers.
func (w *worker) observedTx(ctx context.Context, msgs []*Message, attempt int) (failed int, outcomes []Outcome, tctx context.Context, err error) {
	tctx, obs := w.observe(ctx, msgs, attempt)
	var beyond []horizonNote
	w.lockWait = 0
	failed, outcomes, beyond, err = w.tx(tctx, msgs)
	obs.end(outcomes, w.lockWait, err)
	if err == nil && len(w.r.obs.outcome) > 0 {
		e := &w.events.outcome
		for i, m := range msgs {
			*e = OutcomeEvent{Message: m, Outcome: outcomes[i]}
			for _, b := range beyond {
				if b.index == i {
					e.Horizon = b.err
				}
			}
			w.r.obs.outcomeOf(tctx, e)
		}
		*e = OutcomeEvent{}
	}
	return failed, outcomes, tctx, err
}

// observe calls the TxObservers' TxStart for a transaction of msgs and
// returns the context the transaction runs with and what reports its end.
func (w *worker) observe(ctx context.Context, msgs []*Message, attempt int) (context.Context, observation) {
	list := w.r.obs.tx
	if len(list) == 0 {
		return ctx, observation{}
	}
	start := time.Now()
	e := &w.events.start
	*e = TxStartEvent{Messages: msgs, Attempt: attempt}
	for _, o := range list {
		if c := o.TxStart(ctx, e); c != nil {
			ctx = c
		}
	}
	*e = TxStartEvent{}
	return ctx, observation{list: list, ctx: ctx, msgs: msgs, attempt: attempt, start: start, event: &w.events.end}
}

// observation is a transaction between its TxStart and its TxEnd.
type observation struct {
	list    []TxObserver
	event   *TxEndEvent // the worker's, reused
	ctx     context.Context
	msgs    []*Message
	attempt int
	start   time.Time
}

// end reports the transaction's end to the TxObservers, last first
// (outcomes are dropped when err is not nil).
func (o observation) end(outcomes []Outcome, lockWait time.Duration, err error) {
	if len(o.list) == 0 {
		return
	}
	if err != nil {
		outcomes = nil
	}
	e := o.event
	*e = TxEndEvent{Messages: o.msgs, Attempt: o.attempt, Outcomes: outcomes, Err: err, Duration: time.Since(o.start),
		LockWait: lockWait}
	for i := len(o.list) - 1; i >= 0; i-- {
		o.list[i].TxEnd(o.ctx, e)
	}
	*e = TxEndEvent{}
}

// errSplit asks process to run a batch again in halves: its transaction
// lost its connection (an outage, waited out).
var errSplit = errors.New("consumer: connection lost; running the batch again in halves")

// handlerError marks an error that came from the user's handler.
type handlerError struct {
	index int
	err   error
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

func (w *worker) tx(ctx context.Context, msgs []*Message) (failed int, outcomes []Outcome, beyond []horizonNote, err error) {
	cfg := &w.r.cfg
	outcomes = make([]Outcome, len(msgs))
	live := make([]int, 0, len(msgs)) // messages handled now; the others wait behind a parked message of their key
	if w.parked == nil || len(w.parked.keys) == 0 {
		for i := range msgs {
			live = append(live, i)
		}
	} else {
		for i, m := range msgs {
			if w.parked.parkedKey(m) {
				outcomes[i] = Parked
			} else {
				live = append(live, i)
			}
		}
	}
	parking := len(live) < len(msgs)
	// Claims of UUIDv7 IDs need the layout; read once, and again after
	// a claim found it changed (dedup.ErrLayoutChanged).
	keepDays, err := w.r.claims.Layout(ctx, cfg.pool, txBound(cfg.HandlerTimeout))
	if err != nil {
		return -1, nil, nil, fmt.Errorf("consumer: %w", err)
	}
	// The claims travel with BEGIN: one round trip before the handler runs.
	t := &txRun{w: w, msgs: msgs, live: live, parking: parking, outcomes: outcomes}
	if err = w.runTx(ctx, t); err != nil {
		failed, err = w.txFailed(msgs, keepDays, err)
		return failed, nil, nil, err
	}
	for i, m := range msgs {
		if outcomes[i] == Parked {
			w.parked.keys[string(m.Key)]++
		}
	}
	if parking {
		w.parked.counted()
	}
	for _, b := range t.beyond {
		w.log.WarnContext(ctx, "message beyond the dedup horizon applied (HorizonApply)", "offset", msgs[b.index].Offset,
			"message_id", msgs[b.index].ID, "age", b.err.Age, "horizon", b.err.Horizon)
	}
	return -1, outcomes, t.beyond, nil
}

// txFailed returns what tx returns for err, the error of a transaction of
// msgs: the index of the failing message and the handler's error, or -1. A
// function of its own: the errors.As target would be allocated for every
// transaction otherwise.
func (w *worker) txFailed(msgs []*Message, keepDays int, err error) (int, error) {
	var herr *handlerError
	if errors.As(err, &herr) {
		return herr.index, herr.err
	}
	if len(msgs) == 1 {
		// The message's own verdict: its ID's day has no daily partition.
		m := msgs[0]
		switch {
		case errors.Is(err, dedup.ErrPartitionDropped):
			return 0, &HorizonError{Time: m.Time, Age: time.Since(m.Time),
				Horizon: time.Duration(keepDays) * 24 * time.Hour, Cause: err}
		case errors.Is(err, dedup.ErrNoPartition):
			w.r.askMaintenance()
			return 0, err
		}
	}
	return -1, fmt.Errorf("consumer: transaction: %w", err)
}

// txRun is a transaction of a worker's: what its claims and its body need.
type txRun struct {
	w        *worker
	msgs     []*Message
	live     []int // the messages handled now; the others wait behind a parked message of their key
	parking  bool
	res      claimResults
	outcomes []Outcome
	beyond   []horizonNote // messages applied beyond the horizon (HorizonApply)
}

// claims queues the transaction's claims on b (after its BEGIN).
func (t *txRun) claims(b *pgx.Batch) error {
	return t.w.queueClaims(b, t.msgs, t.live, t.parking, &t.res)
}

// body runs in the transaction once its claims are done: idemkit's own
// writes, then the handler.
func (t *txRun) body(ctx context.Context, tx pgx.Tx) error {
	w, msgs, live, parking, res, outcomes := t.w, t.msgs, t.live, t.parking, &t.res, t.outcomes
	cfg := &w.r.cfg
	dup := res.dup
	if len(live) == 1 && !parking {
		dup = []bool{res.one}
		if !res.moved { // no row yet (or ahead, or another epoch: left as it is)
			m := msgs[0]
			if err := cfg.Store.SavePositionTx(ctx, tx, cfg.Name, m.Topic, m.Partition, m.Offset+1, m.Time, w.epoch); err != nil {
				return err
			}
		}
	}
	for j, i := range live {
		outcomes[i] = Applied
		if dup[j] {
			outcomes[i] = Duplicate
		}
	}
	t.beyond = t.beyond[:0]
	now := time.Now()
	for _, i := range live {
		herr := w.beyondHorizon(msgs[i], outcomes[i], now)
		if herr == nil {
			continue
		}
		if cfg.OnBeyondHorizon == HorizonFail {
			return &handlerError{index: i, err: herr}
		}
		t.beyond = append(t.beyond, horizonNote{i, herr})
	}
	// idemkit's own writes go before the handler's: an error after the
	// handler ran is the handler's (say, a transaction it made
	// read-only), never taken for an outage.
	if parking {
		var waiting []*Message
		for i, m := range msgs {
			if outcomes[i] == Parked {
				waiting = append(waiting, m)
			}
		}
		if err := w.parked.insert(ctx, tx, waiting, nil, 0); err != nil {
			return err
		}
		last := msgs[len(msgs)-1]
		if err := cfg.Store.SavePositionTx(ctx, tx, cfg.Name, last.Topic, last.Partition, last.Offset+1, last.Time, w.epoch); err != nil {
			return err
		}
	}
	hctx, cancel := context.WithTimeout(ctx, cfg.HandlerTimeout)
	defer cancel()
	if err := w.handle(hctx, tx, msgs, outcomes); err != nil {
		if lost := connectionLost(tx, err); lost != nil {
			return lost // an outage, not the handler's verdict
		}
		return err
	}
	return nil
}

// horizonNote is a message of a transaction found beyond the horizon.
type horizonNote struct {
	index int
	err   *HorizonError
}

// beyondHorizon returns the *HorizonError of a message whose claim came
// back new (outcome Applied) although its timestamp is older than
// Retention minus HorizonMargin, by now; nil when Retention is not set,
// the claim was a duplicate, or the message has no timestamp.
func (w *worker) beyondHorizon(m *Message, outcome Outcome, now time.Time) *HorizonError {
	cfg := &w.r.cfg
	if cfg.Retention <= 0 || outcome != Applied || m.Time.IsZero() {
		return nil
	}
	horizon := cfg.Retention - cfg.HorizonMargin
	if age := now.Sub(m.Time); age > horizon {
		return &HorizonError{Time: m.Time, Age: age, Horizon: horizon}
	}
	return nil
}

// connectionLost returns a non-handler error when a handler failed because
// the transaction's connection to PostgreSQL was lost: that is an outage,
// waited out without spending the message's retries.
func connectionLost(tx pgx.Tx, err error) error {
	// What is returned must not be taken for the handler's verdict: drop
	// the handlerError mark.
	if herr := (*handlerError)(nil); errors.As(err, &herr) {
		err = herr.err
	}
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	switch {
	case !tx.Conn().IsClosed():
		// The server answered on this connection (class 53 included, such
		// as 53400 for temp_file_limit), or the handler failed by itself
		// (an io.EOF of its own is no outage): the handler's verdict, which
		// the retry policy classifies.
		return nil
	case retry.IsPermanent(err):
		return nil // the handler's verdict, whatever it wraps
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// The handler's own deadline (pgx closes a connection whose
		// statement's context ended), or the runner stopping: not an outage.
		return nil
	case isPg && !retry.IsConnection(err):
		// The server ended the session for what the transaction did (25P03,
		// idle_in_transaction_session_timeout): it would happen again on
		// every run, the handler's verdict, charged as an attempt.
		return nil
	case retry.IsConnection(err):
		return fmt.Errorf("consumer: connection to PostgreSQL lost during the handler: %w", err)
	}
	// The connection died under the handler; say so in a way
	// retry.IsConnection recognises.
	return fmt.Errorf("consumer: connection to PostgreSQL lost during the handler (%w): %w", err, errConnClosed)
}

// errConnClosed is recognised by retry.IsConnection.
var errConnClosed = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection to PostgreSQL closed")}

// handle runs the user's handler for the messages whose claim is new.
func (w *worker) handle(ctx context.Context, tx pgx.Tx, msgs []*Message, outcomes []Outcome) error {
	cfg := &w.r.cfg
	if cfg.BatchHandler != nil {
		fresh := make([]*Message, 0, len(msgs))
		for i, m := range msgs {
			if outcomes[i] == Applied {
				fresh = append(fresh, m)
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		if err := callBatch(ctx, cfg.BatchHandler, tx, fresh); err != nil {
			return &handlerError{index: 0, err: err}
		}
		return nil
	}
	for i, m := range msgs {
		if outcomes[i] != Applied {
			continue
		}
		if err := call(ctx, cfg.Handler, tx, m); err != nil {
			return &handlerError{index: i, err: err}
		}
	}
	return nil
}

// handleOne runs the user's handler for one message.
func (w *worker) handleOne(ctx context.Context, tx pgx.Tx, m *Message) error {
	if h := w.r.cfg.BatchHandler; h != nil {
		return callBatch(ctx, h, tx, []*Message{m})
	}
	return call(ctx, w.r.cfg.Handler, tx, m)
}

// inTx runs f in a transaction and commits it. The transaction is bounded
// as runTx bounds its own, for a body that may be idle for budget: f gets
// a context that ends after txBound(budget), and PostgreSQL ends the
// transaction once idle that long. Once f succeeded, the commit is finished
// even if ctx is cancelled meanwhile (a shutdown does not leave the outcome
// of work in flight unknown); on any error it rolls back, also with a
// context that survives the caller's cancellation.
func inTx(ctx context.Context, pool *pgxpool.Pool, budget time.Duration, f func(ctx context.Context, tx pgx.Tx) error) error {
	bounded, cancel := context.WithTimeout(ctx, txBound(budget))
	defer cancel()
	tx, err := pool.BeginTx(bounded, pgx.TxOptions{BeginQuery: pgsession.BeginQuery("", budget)})
	if err != nil {
		return err
	}
	err = f(bounded, tx)
	// Made once f returned: f's own time does not count against the
	// commit's.
	detached, cancel := detach(ctx)
	defer cancel()
	if err != nil {
		dropReadOnly(detached, tx, err)
		_ = tx.Rollback(detached)
		return err
	}
	if err := tx.Commit(detached); err != nil {
		dropReadOnly(detached, tx, err)
		_ = tx.Rollback(detached)
		return err
	}
	return nil
}

// dropReadOnly closes tx's connection after a read_only_sql_transaction
// error (SQLSTATE 25006), before the rollback gives it back to the pool
// (which then discards it; the server rolls the transaction back), so that
// the pool opens a new one rather than hand it out again: a session made read-only (SET SESSION CHARACTERISTICS, a
// handler's doing) is gone with it, and a new session goes to the server
// the pool's URL names now (target_session_attrs=read-write finds the
// promoted standby). If the server itself takes no writes, the new session
// gets 25006 as well: an outage, waited out.
func dropReadOnly(ctx context.Context, tx pgx.Tx, err error) {
	if retry.IsReadOnly(err) {
		_ = tx.Conn().Close(ctx)
	}
}

// commitTimeout bounds a commit or rollback, from when it starts: it
// outlives the runner's cancellation, and gives up a connection gone
// silent (a commit whose answer never came is settled by the claims when
// the transaction runs again). A variable for tests.
var commitTimeout = pgsession.Margin

// callIDFunc runs the user's IDFunc; a panic becomes its error (the
// message then has no usable ID).
func callIDFunc(f func(*kafka.Message) (string, error), m *kafka.Message) (id string, err error) {
	defer recoverPanic("consumer: IDFunc", &err)
	return f(m)
}

// callOnFailure runs the user's OnFailure; a panic becomes its error (the
// runner stops and the position does not move).
func callOnFailure(ctx context.Context, f FailureFunc, msg *Message, merr error) (err error) {
	defer recoverPanic("consumer: OnFailure", &err)
	return f(ctx, msg, merr)
}

func call(ctx context.Context, h Handler, tx pgx.Tx, m *Message) (err error) {
	defer recoverPanic("consumer: handler", &err)
	return h.Handle(ctx, tx, m)
}

func callBatch(ctx context.Context, h BatchHandler, tx pgx.Tx, msgs []*Message) (err error) {
	defer recoverPanic("consumer: batch handler", &err)
	return h.HandleBatch(ctx, tx, msgs)
}
