package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/pgtext"
	"github.com/idemkit/idemkit/retry"
)

// FailureMode says what a failing message does to the messages behind it.
type FailureMode int

const (
	// Blocking retries a failing message in place: its partition waits until
	// it succeeds or is given up on (OnFailure). Order is total within the
	// partition. Choose it when messages of different keys depend on each
	// other, or when failures are rare and short.
	Blocking FailureMode = iota
	// NonBlocking keeps order per key only. After the in-place attempts of
	// Config.Retry, a message that still fails with a transient error is
	// parked in PostgreSQL, in the transaction that moves the partition's
	// position past it; every later message with the same key is parked
	// behind it, and other keys keep flowing. Parked messages are retried
	// under Config.ParkedRetry and released strictly in offset order per key.
	// When the head of a key fails for good (permanent error, or
	// ParkedRetry used up) it goes to OnFailure (the dead-letter topic) and
	// the next parked message of the key becomes the head at once; without
	// OnFailure it stays parked and is retried at the policy's longest
	// interval. Choose it when a poison message or a sick dependency must
	// not stall unrelated keys (accounts, orders).
	NonBlocking
)

// Defaults for the non-blocking mode.
const (
	ParkedPollDefault = 500 * time.Millisecond
)

// parkedRetryDefault paces retries of parked messages.
var parkedRetryDefault = retry.Policy{InitialInterval: time.Second, MaxInterval: time.Minute, MaxAttempts: 10, MaxElapsedTime: -1}

// parker keeps a partition's parked messages in the non-blocking mode. It is
// used only by its worker's goroutine.
type parker struct {
	w    *worker
	sql  *parkSQL
	keys map[string]int // parked messages per key
	due  time.Time      // when to look for due parked messages next
}

// header is a parked message's header as stored (jsonb). Kafka header keys
// are bytes, not always valid UTF-8 and possibly with NUL, which a JSON
// string in jsonb cannot hold: the key is written as bytes (base64, "kb").
// A header with a string key in "k" is read as well.
type header struct {
	Key      string `json:"k,omitempty"`
	KeyBytes []byte `json:"kb,omitempty"`
	Value    []byte `json:"v"`
}

// keyBytes is a message key as stored: a message without a key (nil) has
// the empty key, which message_key (NOT NULL) can hold.
func keyBytes(k []byte) []byte {
	if k == nil {
		return []byte{}
	}
	return k
}

func newParker(w *worker) *parker {
	return &parker{w: w, sql: &w.r.parkSQL, keys: map[string]int{}}
}

// load reads which keys of the partition have parked messages.
func (p *parker) load(ctx context.Context) error {
	cfg := &p.w.r.cfg
	rows, err := cfg.pool.Query(ctx, p.sql.keys, cfg.Name, cfg.Topic, p.w.partition)
	if err != nil {
		return fmt.Errorf("consumer: read parked keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key []byte
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return err
		}
		p.keys[string(key)] = n
	}
	p.counted()
	return rows.Err()
}

// counted reports the parked messages to Runner.Partitions after keys
// changed.
func (p *parker) counted() {
	n := 0
	for _, c := range p.keys {
		n += c
	}
	p.w.state.parked.Store(int64(n))
}

// parkedKey reports whether msg must wait behind a parked message of its key.
func (p *parker) parkedKey(msg *Message) bool { return p != nil && p.keys[string(msg.Key)] > 0 }

// insert parks msgs in tx, with the failure f for the first one when given,
// due after delay. Due times are on the database's clock (see releaseDue).
func (p *parker) insert(ctx context.Context, tx pgx.Tx, msgs []*Message, f *failure, delay time.Duration) error {
	cfg := &p.w.r.cfg
	for i, m := range msgs {
		hs := make([]header, len(m.Headers))
		for j, h := range m.Headers {
			hs[j] = header{KeyBytes: []byte(h.Key), Value: h.Value}
		}
		js, err := json.Marshal(hs)
		if err != nil {
			return err
		}
		var attempts int
		var first, last *time.Time
		var lastErr *string
		var wait time.Duration
		if i == 0 && f != nil {
			attempts, first, last, wait = f.attempts, &f.first, &f.last, delay
			s := pgtext.Text(f.err.Error(), 2000)
			lastErr = &s
		}
		_, err = tx.Exec(ctx, p.sql.insert,
			cfg.Name, m.Topic, m.Partition, m.Offset, keyBytes(m.Key), m.ID, m.Value, js, m.Time, attempts, first, last, lastErr, wait.Microseconds(),
			m.Incarnation)
		if err != nil {
			return fmt.Errorf("consumer: park %s/%d/%d: %w", m.Topic, m.Partition, m.Offset, err)
		}
	}
	return nil
}

// park parks a message that failed in place, in the transaction that moves
// the partition's position past it.
func (p *parker) park(ctx context.Context, msg *Message, f failure) error {
	cfg := &p.w.r.cfg
	delay, _ := p.delay(1)
	err := p.w.outage.Do(ctx, func(ctx context.Context) error {
		return inTx(ctx, cfg.pool, 0, func(ctx context.Context, tx pgx.Tx) error {
			if err := p.insert(ctx, tx, []*Message{msg}, &f, delay); err != nil {
				return err
			}
			return cfg.Store.SavePositionTx(ctx, tx, cfg.Name, msg.Topic, msg.Partition, msg.Offset+1, msg.Time, p.w.epoch)
		})
	})
	if err != nil {
		return err
	}
	p.keys[string(msg.Key)]++
	p.counted()
	p.w.log.WarnContext(f.logCtx(ctx), "message parked; its key waits, other keys flow", "offset", msg.Offset, "message_id", msg.ID,
		"attempts", f.attempts, "retry_in", delay, "err", f.err)
	p.w.r.obs.outcomeOf(f.logCtx(ctx), &OutcomeEvent{Message: msg, Outcome: Parked})
	return nil
}

// delay is the wait after a parked message's attempt-th failure, or false
// when its retries are used up.
func (p *parker) delay(attempt int) (time.Duration, bool) {
	s := p.w.r.cfg.ParkedRetry.Schedule()
	var d time.Duration
	for range attempt {
		var ok bool
		if d, ok = s.Next(); !ok {
			return p.w.r.cfg.ParkedRetry.MaxIntervalOrDefault(), false
		}
	}
	return d, true
}

// parkedMsg is a parked row.
type parkedMsg struct {
	msg      *Message
	attempts int
	first    *time.Time
	due      bool // next_attempt_at has come, by the database's clock
}

// head returns the first parked message of key, if any.
func (p *parker) head(ctx context.Context, key []byte) (*parkedMsg, error) {
	cfg := &p.w.r.cfg
	var (
		pm    parkedMsg
		m     kafka.Message
		id    string
		js    []byte
		mtime *time.Time
	)
	var incarnation int64
	err := cfg.pool.QueryRow(ctx, p.sql.head, cfg.Name, cfg.Topic, p.w.partition, key).
		Scan(&incarnation, &m.Offset, &id, &m.Value, &js, &mtime, &pm.attempts, &pm.first, &pm.due)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("consumer: read parked head: %w", err)
	}
	var hs []header
	if err := json.Unmarshal(js, &hs); err != nil {
		return nil, fmt.Errorf("consumer: parked headers: %w", err)
	}
	for _, h := range hs {
		k := h.Key
		if h.KeyBytes != nil {
			k = string(h.KeyBytes)
		}
		m.Headers = append(m.Headers, kafka.Header{Key: k, Value: h.Value})
	}
	m.Topic, m.Partition, m.Key = cfg.Topic, p.w.partition, key
	if mtime != nil {
		m.Time = *mtime
	}
	pm.msg = &Message{Message: m, ID: id, Incarnation: incarnation}
	return &pm, nil
}

// releaseDue retries the due heads of parked keys, and on success the
// messages parked behind them, in offset order.
func (p *parker) releaseDue(ctx context.Context) error {
	if len(p.keys) == 0 || p.w.r.now().Before(p.due) {
		return nil
	}
	p.due = p.w.r.now().Add(p.w.r.cfg.ParkedPoll)
	// One statement finds the keys whose head is due; each of those is then
	// released as far as it goes.
	cfg := &p.w.r.cfg
	rows, err := cfg.pool.Query(ctx, p.sql.dueKeys, cfg.Name, cfg.Topic, p.w.partition)
	if err != nil {
		return fmt.Errorf("consumer: find due parked messages: %w", err)
	}
	due, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return fmt.Errorf("consumer: find due parked messages: %w", err)
	}
	defer p.counted()
	for _, key := range due {
		if err := p.releaseKey(ctx, key); err != nil {
			return err
		}
	}
	return nil
}

func (p *parker) releaseKey(ctx context.Context, key []byte) error {
	cfg := &p.w.r.cfg
	for {
		pm, err := p.head(ctx, key)
		if err != nil {
			return err
		}
		if pm == nil {
			delete(p.keys, string(key))
			return nil
		}
		if !pm.due {
			return nil
		}
		var dup bool
		tctx, obs := p.w.observe(ctx, []*Message{pm.msg}, pm.attempts+1)
		err = inTx(tctx, cfg.pool, cfg.HandlerTimeout, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			dup, err = cfg.Store.ClaimTx(ctx, tx, dedup.Claim{Consumer: cfg.Name, MessageID: pm.msg.ID,
				Topic: pm.msg.Topic, Partition: pm.msg.Partition, Offset: pm.msg.Offset})
			if err != nil {
				return err
			}
			// idemkit's own writes go before the handler's: an error after
			// the handler ran is the handler's (say, a transaction it made
			// read-only), never taken for an outage.
			if err := p.remove(ctx, tx, pm.msg); err != nil {
				return err
			}
			if !dup {
				hctx, cancel := context.WithTimeout(ctx, cfg.HandlerTimeout)
				defer cancel()
				if err := p.w.handleOne(hctx, tx, pm.msg); err != nil {
					if lost := connectionLost(tx, err); lost != nil {
						return lost // an outage, not the handler's verdict
					}
					return &handlerError{err: err}
				}
			}
			return nil
		})
		outcome := Applied
		if dup {
			outcome = Duplicate
		}
		obs.end([]Outcome{outcome}, 0, err)
		var herr *handlerError
		switch {
		case err == nil:
			p.keys[string(key)]--
			p.w.r.obs.outcomeOf(tctx, &OutcomeEvent{Message: pm.msg, Outcome: outcome})
			continue // the next parked message of the key is due at once
		case errors.As(err, &herr):
			if done, err := p.failed(ctx, tctx, pm, herr.err); err != nil || !done {
				return err
			}
			continue
		default:
			return fmt.Errorf("consumer: release parked %d: %w", pm.msg.Offset, err)
		}
	}
}

func (p *parker) remove(ctx context.Context, db dedup.DBTX, m *Message) error {
	cfg := &p.w.r.cfg
	_, err := db.Exec(ctx, p.sql.remove, cfg.Name, m.Topic, m.Partition, m.Incarnation, m.Offset)
	return err
}

// failed records a parked head's failure. It returns done=true when the
// head left the parking (given to OnFailure), so the next one may go.
func (p *parker) failed(ctx, tctx context.Context, pm *parkedMsg, err error) (done bool, _ error) {
	cfg := &p.w.r.cfg
	now := time.Now()
	f := failure{attempts: pm.attempts + 1, class: cfg.Retry.Classify(err), first: now, last: now, err: err, ctx: tctx}
	if pm.first != nil {
		f.first = *pm.first
	}
	if f.class == retry.ClassStop && ctx.Err() != nil {
		return false, ctx.Err()
	}
	delay, more := p.delay(f.attempts)
	if (f.class == retry.ClassPermanent || !more) && cfg.OnFailure != nil {
		if err := p.w.giveUp(ctx, pm.msg, f, false); err != nil {
			return false, err
		}
		// OnFailure took the head: wait out an outage here rather than hand
		// it to OnFailure a second time.
		if err := p.w.outage.Do(ctx, func(ctx context.Context) error { return p.remove(ctx, cfg.pool, pm.msg) }); err != nil {
			return false, fmt.Errorf("consumer: unpark %d: %w", pm.msg.Offset, err)
		}
		p.keys[string(pm.msg.Key)]--
		return true, nil
	}
	p.w.log.WarnContext(f.logCtx(ctx), "parked message failed again", "offset", pm.msg.Offset, "message_id", pm.msg.ID,
		"attempts", f.attempts, "retry_in", delay, "err", err)
	_, uerr := cfg.pool.Exec(ctx, p.sql.failed, cfg.Name, pm.msg.Topic, pm.msg.Partition, pm.msg.Offset, f.attempts, f.first, f.last, pgtext.Text(err.Error(), 2000), delay.Microseconds(),
		pm.msg.Incarnation)
	if uerr != nil {
		return false, fmt.Errorf("consumer: record parked failure: %w", uerr)
	}
	return false, nil
}
