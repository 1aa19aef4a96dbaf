package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/retry"
)

// worker processes one partition for one generation, in offset order.
type worker struct {
	r         *Runner
	commits   *committer
	parked    *parker // NonBlocking mode only
	partition int
	start     int64
	fail      func(error)
	log       *slog.Logger
}

func (w *worker) run(runCtx, genCtx context.Context) {
	// ctx ends with the run or with the generation (a rebalance), whichever
	// comes first; a transaction in flight then rolls back.
	ctx, stop := context.WithCancel(runCtx)
	defer stop()
	defer context.AfterFunc(genCtx, stop)()

	cfg := &w.r.cfg
	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   cfg.Brokers,
		Dialer:    cfg.Dialer,
		Topic:     cfg.Topic,
		Partition: w.partition,
		MinBytes:  1,
		MaxBytes:  8 << 20,
		MaxWait:   250 * time.Millisecond,
		// A full batch can wait in the reader's queue while the previous
		// batch commits, so that BatchLinger is not spent refilling it.
		QueueCapacity: max(100, cfg.BatchSize),
	})
	defer reader.Close()
	if err := reader.SetOffset(w.start); err != nil {
		w.fail(fmt.Errorf("consumer: partition %d: set offset %d: %w", w.partition, w.start, err))
		return
	}
	w.log.Debug("partition assigned", "start_offset", w.start)
	if cfg.FailureMode == NonBlocking {
		w.parked = newParker(w)
		if err := w.parked.load(ctx); err != nil {
			if ctx.Err() == nil {
				w.fail(err)
			}
			return
		}
	}

	for {
		if w.parked != nil {
			if err := w.parked.releaseDue(ctx); err != nil {
				if ctx.Err() == nil {
					w.fail(err)
				}
				return
			}
		}
		batch, err := w.fetch(ctx, reader)
		if errors.Is(err, errIdle) {
			continue // time to look at parked messages
		}
		if err != nil {
			if ctx.Err() == nil {
				w.log.Error("fetch failed; leaving the generation", "err", err)
			}
			return
		}
		if err := w.acquire(ctx); err != nil {
			return
		}
		err = w.process(ctx, batch)
		<-w.r.sem
		if err != nil {
			if ctx.Err() == nil {
				w.fail(err)
			}
			return
		}
		// The transaction committed: the offset may now go to Kafka.
		w.commits.mark(w.partition, batch[len(batch)-1].Offset+1)
	}
}

func (w *worker) acquire(ctx context.Context) error {
	select {
	case w.r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errIdle means no message came while parked messages may be due.
var errIdle = errors.New("idle")

// fetch waits for one message, then gathers up to BatchSize-1 more for at
// most BatchLinger. With parked messages it waits at most ParkedPoll and
// returns errIdle.
func (w *worker) fetch(ctx context.Context, reader *kafka.Reader) ([]*Message, error) {
	cfg := &w.r.cfg
	wait := ctx
	if w.parked != nil && len(w.parked.keys) > 0 {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, cfg.ParkedPoll)
		defer cancel()
	}
	first, err := reader.FetchMessage(wait)
	if err != nil {
		if ctx.Err() == nil && wait.Err() != nil {
			return nil, errIdle
		}
		return nil, err
	}
	batch := []*Message{w.message(first)}
	if cfg.BatchSize == 1 {
		return batch, nil
	}
	linger, cancel := context.WithTimeout(ctx, cfg.BatchLinger)
	defer cancel()
	for len(batch) < cfg.BatchSize {
		m, err := reader.FetchMessage(linger)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			break // linger elapsed
		}
		batch = append(batch, w.message(m))
	}
	return batch, nil
}

// message wraps a Kafka message and extracts its ID; an empty ID means none
// was usable (process fails such a message with ErrMissingID).
func (w *worker) message(m kafka.Message) *Message {
	cfg := &w.r.cfg
	msg := &Message{Message: m}
	var id string
	if cfg.IDFunc != nil {
		var err error
		if id, err = cfg.IDFunc(&m); err != nil {
			msg.idErr = fmt.Errorf("%w: IDFunc: %w", ErrMissingID, err)
			id = ""
		}
	} else {
		for _, h := range m.Headers {
			if h.Key == cfg.IDHeader {
				id = string(h.Value)
				break
			}
		}
	}
	if id == "" && cfg.MissingID == MissingIDUseCoordinates {
		id = m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10)
	}
	switch err := dedup.ValidateID("message ID", id); {
	case id == "" && msg.idErr == nil:
		msg.idErr = fmt.Errorf("%w: no %q header", ErrMissingID, cfg.IDHeader)
	case id != "" && err != nil:
		msg.idErr = fmt.Errorf("%w: %w", ErrMissingID, err)
	case id != "":
		msg.ID = id
	}
	return msg
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
		failed, err := w.commit(ctx, msgs)
		if err == nil {
			return nil
		}
		if failed < 0 || ctx.Err() != nil {
			return err
		}
		if len(msgs) == 1 {
			return w.retry(ctx, msgs[0], err)
		}
		// Commit what came before the failure, isolate the failure, go on.
		// A batch handler does not say which message failed: split in halves.
		if w.r.cfg.BatchHandler != nil {
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
		if err := w.retry(ctx, msgs[failed], err); err != nil {
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
// succeeds, its error proves permanent, or the schedule is used up.
func (w *worker) retry(ctx context.Context, msg *Message, err error) error {
	cfg := &w.r.cfg
	schedule := cfg.Retry.Schedule()
	f := failure{first: time.Now()}
	for f.attempts = 1; ; f.attempts++ {
		f.last, f.err = time.Now(), err
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
		delay := schedule.NextBackOff()
		if delay == backoff.Stop {
			if w.parked != nil {
				return w.parked.park(ctx, msg, f)
			}
			return w.giveUp(ctx, msg, f, true)
		}
		w.log.Warn("handler failed; retrying", "offset", msg.Offset, "message_id", msg.ID,
			"attempt", f.attempts, "delay", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		var failed int
		if failed, err = w.commit(ctx, []*Message{msg}); err == nil {
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
	if perr := (*PanicError)(nil); errors.As(f.err, &perr) {
		log = log.With("stack", string(perr.Stack))
	}
	if cfg.OnFailure == nil {
		log.Error("message failed for good; stopping (no OnFailure)")
		return merr
	}
	log.Warn("message failed for good; handing it to OnFailure")
	if ferr := cfg.OnFailure(ctx, msg, merr); ferr != nil {
		return fmt.Errorf("consumer: OnFailure for %s/%d/%d: %w", msg.Topic, msg.Partition, msg.Offset, ferr)
	}
	if savePosition {
		err := inTx(ctx, cfg.Pool, func(tx pgx.Tx) error {
			return cfg.Store.SavePositionTx(ctx, tx, cfg.Name, msg.Topic, msg.Partition, msg.Offset+1)
		})
		if err != nil {
			return fmt.Errorf("consumer: save position past failed message: %w", err)
		}
	}
	if h := cfg.Hooks.Outcome; h != nil {
		h(msg, Failed)
	}
	return nil
}

// commit runs msgs in one transaction: claim every ID and record the
// position in one statement, run the handler for the new ones, commit.
// On a handler error it returns the index of the failing message (0 for a
// batch handler); on any other error, -1. Serialization failures and
// deadlocks run the transaction again.
func (w *worker) commit(ctx context.Context, msgs []*Message) (failed int, err error) {
	cfg := &w.r.cfg
	for try := 1; ; try++ {
		var outcomes []Outcome
		failed, outcomes, err = w.tx(ctx, msgs)
		if err == nil {
			if h := cfg.Hooks.Outcome; h != nil {
				for i, m := range msgs {
					h(m, outcomes[i])
				}
			}
			return -1, nil
		}
		if !retryableTx(err) || try >= cfg.TxRetries || ctx.Err() != nil {
			return failed, err
		}
		w.log.Debug("transaction conflict; running it again", "try", try, "err", err)
	}
}

// handlerError marks an error that came from the user's handler.
type handlerError struct {
	index int
	err   error
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

func (w *worker) tx(ctx context.Context, msgs []*Message) (failed int, outcomes []Outcome, err error) {
	cfg := &w.r.cfg
	outcomes = make([]Outcome, len(msgs))
	var live []int // messages handled now; the others wait behind a parked message of their key
	for i, m := range msgs {
		if w.parked.parkedKey(m) {
			outcomes[i] = Parked
		} else {
			live = append(live, i)
		}
	}
	parking := len(live) < len(msgs)
	err = inTx(ctx, cfg.Pool, func(tx pgx.Tx) error {
		claim := func(m *Message) dedup.Claim {
			return dedup.Claim{Consumer: cfg.Name, MessageID: m.ID, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
		}
		var dup []bool
		switch {
		case len(live) == 1 && !parking:
			d, err := cfg.Store.ClaimWithPositionTx(ctx, tx, claim(msgs[0]))
			if err != nil {
				return err
			}
			dup = []bool{d}
		case len(live) > 0:
			claims := make([]dedup.Claim, len(live))
			for j, i := range live {
				claims[j] = claim(msgs[i])
			}
			var err error
			if dup, err = cfg.Store.ClaimBatchTx(ctx, tx, claims); err != nil {
				return err
			}
		}
		for j, i := range live {
			outcomes[i] = Applied
			if dup[j] {
				outcomes[i] = Duplicate
			}
		}
		if err := w.handle(ctx, tx, msgs, outcomes); err != nil {
			return err
		}
		if parking {
			var waiting []*Message
			for i, m := range msgs {
				if outcomes[i] == Parked {
					waiting = append(waiting, m)
				}
			}
			if err := w.parked.insert(ctx, tx, waiting, nil, time.Time{}); err != nil {
				return err
			}
			last := msgs[len(msgs)-1]
			if err := cfg.Store.SavePositionTx(ctx, tx, cfg.Name, last.Topic, last.Partition, last.Offset+1); err != nil {
				return err
			}
		}
		if h := cfg.Hooks.BeforeCommit; h != nil {
			h(ctx, msgs)
		}
		return nil
	})
	var herr *handlerError
	if errors.As(err, &herr) {
		return herr.index, nil, herr.err
	}
	if err != nil {
		return -1, nil, fmt.Errorf("consumer: transaction: %w", err)
	}
	for i, m := range msgs {
		if outcomes[i] == Parked {
			w.parked.keys[string(m.Key)]++
		}
	}
	if h := cfg.Hooks.AfterCommit; h != nil {
		h(ctx, msgs)
	}
	return -1, outcomes, nil
}

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

// inTx runs f in a transaction and commits it. Once f succeeded, the commit
// is finished even if ctx is cancelled meanwhile (a shutdown does not leave
// the outcome of work in flight unknown); on any error it rolls back, also
// with a context that survives the caller's cancellation.
func inTx(ctx context.Context, pool *pgxpool.Pool, f func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	detached, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := f(tx); err != nil {
		_ = tx.Rollback(detached)
		return err
	}
	if err := tx.Commit(detached); err != nil {
		_ = tx.Rollback(detached)
		return err
	}
	return nil
}

// commitTimeout bounds a commit or rollback that outlives a cancellation.
const commitTimeout = 30 * time.Second

func call(ctx context.Context, h Handler, tx pgx.Tx, m *Message) (err error) {
	defer recoverPanic(&err)
	return h.Handle(ctx, tx, m)
}

func callBatch(ctx context.Context, h BatchHandler, tx pgx.Tx, msgs []*Message) (err error) {
	defer recoverPanic(&err)
	return h.HandleBatch(ctx, tx, msgs)
}
