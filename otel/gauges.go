package idemotel

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
)

// ErrObserving is returned by Consumer.Observe when the consumer already
// observes a runner.
var ErrObserving = errors.New("idemotel: consumer already observes a runner")

// Observe registers the consumer's gauges, read at each collection (each
// scrape, with the Prometheus exporter):
//
//   - idemkit_consumer_lag and idemkit_consumer_position per partition r
//     holds, and idemkit_consumer_parked_messages, from r.Partitions (no
//     I/O; nothing while r holds no partition);
//   - idemkit_consumer_parked_oldest_age_seconds and
//     idemkit_dedup_oldest_record_age_seconds, from PostgreSQL through the
//     runner's pool (Runner.Pool): each a min() over an index of the consumer's rows,
//     run at most once per Config.QueryInterval and bounded by
//     Config.QueryTimeout (0 when there is no row);
//   - idemkit_dedup_daily_partitions_ahead_days, with the daily dedup
//     layout only: how many days after today (UTC, the database's clock)
//     are covered by partitions without a gap (dedup.Store.Partitions;
//     days before DailyFrom need none), -1 when today is not, at most once
//     per QueryInterval; below 1, claims dated tomorrow will fail;
//   - idemkit_dedup_retention_seconds, the consumer's Config.Retention, when
//     it is set (without it nothing purges, and the gauge is absent so that
//     a retention alert does not compare with 0).
//
// r must be the runner made from the consumer.Config given to
// Telemetry.Consumer. Close unregisters the gauges.
func (c *Consumer) Observe(r *consumer.Runner) error {
	if r == nil {
		return fmt.Errorf("%w: nil runner", ErrInvalidConfig)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reg != nil {
		return ErrObserving
	}
	c.pool = r.Pool()
	in := &c.t.consumer
	observed := []metric.Observable{in.lag, in.position, in.parked}
	if c.pool != nil {
		observed = append(observed, in.parkedOldestAge, in.oldestRecordAge, in.partitionsAhead)
	}
	if c.retention > 0 {
		observed = append(observed, in.retention)
	}
	reg, err := c.t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		c.observe(ctx, o, r)
		return nil
	}, observed...)
	if err != nil {
		return fmt.Errorf("idemotel: register the consumer's gauges: %w", err)
	}
	c.reg = reg
	return nil
}

// Close unregisters the gauges Observe registered. The hooks and the
// middleware stay in the consumer's configuration: they count as long as
// the runner runs.
func (c *Consumer) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reg == nil {
		return nil
	}
	err := c.reg.Unregister()
	c.reg = nil
	return err
}

func (c *Consumer) observe(ctx context.Context, o metric.Observer, r *consumer.Runner) {
	in := &c.t.consumer
	if parts := r.Partitions(); len(parts) > 0 {
		var parked int64
		for _, p := range parts {
			opts := c.partitionAttrs(p.Partition)
			o.ObserveInt64(in.lag, p.Lag, opts.obs...)
			if p.Next >= 0 { // a start sentinel (first or last offset) is no position
				o.ObserveInt64(in.position, p.Next, opts.obs...)
			}
			parked += int64(p.Parked)
		}
		o.ObserveInt64(in.parked, parked, c.base.obs...)
	}
	if c.pool != nil {
		if age, ok := c.parkedAge.get(ctx, c.pool, c.t.cfg.QueryInterval, c.t.cfg.QueryTimeout); ok {
			o.ObserveFloat64(in.parkedOldestAge, age, c.base.obs...)
		}
		if age, ok := c.oldest.get(ctx, c.pool, c.t.cfg.QueryInterval, c.t.cfg.QueryTimeout); ok {
			o.ObserveFloat64(in.oldestRecordAge, age, c.consumerOnly.obs...)
		}
		if days, ok := c.ahead.get(ctx, c.pool, c.t.cfg.QueryInterval, c.t.cfg.QueryTimeout); ok {
			o.ObserveInt64(in.partitionsAhead, days, c.consumerOnly.obs...)
		}
	}
	if c.retention > 0 {
		o.ObserveFloat64(in.retention, c.retention.Seconds(), c.consumerOnly.obs...)
	}
}

// partitionAttrs returns the attributes of a partition's series, made once
// per partition. Only the callback calls it, under no lock of ours: the SDK
// runs one collection at a time per reader, but several readers may collect
// at once.
func (c *Consumer) partitionAttrs(partition int) attrOpts {
	c.partMu.Lock()
	defer c.partMu.Unlock()
	opts, ok := c.partitions[partition]
	if !ok {
		opts = attrs(keyConsumer, c.name, keyTopic, c.topic, keyPartition, strconv.Itoa(partition))
		c.partitions[partition] = opts
	}
	return opts
}

// ageQuery is a gauge's query for the age in seconds of the oldest row
// (NULL when there is none), cached.
type ageQuery struct {
	what string // for errors
	sql  string
	args []any

	mu   sync.Mutex // one query at a time, whatever the scrapes
	at   time.Time  // when the last answer (or failure) came
	age  float64    // the answer, as of at
	ok   bool       // the last query succeeded
	none bool       // … and found no row
}

// get returns the age now: the cached answer plus the time since it came,
// or a new answer when the cached one is older than interval. false means
// the last query failed (reported to otel.Handle): the gauge is left out
// until the next query, an interval later.
func (q *ageQuery) get(ctx context.Context, pool *pgxpool.Pool, interval, timeout time.Duration) (float64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.at.IsZero() || time.Since(q.at) >= interval {
		qctx, cancel := context.WithTimeout(ctx, timeout)
		var age *float64
		err := pool.QueryRow(qctx, q.sql, q.args...).Scan(&age)
		cancel()
		q.at, q.ok = time.Now(), err == nil
		if err != nil {
			otel.Handle(fmt.Errorf("idemotel: query the %s: %w", q.what, err))
			return 0, false
		}
		q.none = age == nil
		if age != nil {
			q.age = max(*age, 0)
		}
	}
	switch {
	case !q.ok:
		return 0, false
	case q.none:
		return 0, true
	}
	return q.age + time.Since(q.at).Seconds(), true
}

// aheadQuery reads how many days of daily partitions lie ahead of today,
// cached like ageQuery.
type aheadQuery struct {
	store *dedup.Store // nil: no gauge

	mu    sync.Mutex
	at    time.Time
	days  int64
	daily bool // the last query succeeded and found the daily layout
}

// get returns the days ahead; false with the flat layout, or when the last
// query failed (reported to otel.Handle).
func (q *aheadQuery) get(ctx context.Context, pool *pgxpool.Pool, interval, timeout time.Duration) (int64, bool) {
	if q.store == nil {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.at.IsZero() || time.Since(q.at) >= interval {
		qctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		q.at, q.daily = time.Now(), false
		l, err := q.store.Layout(qctx, pool)
		if err != nil {
			otel.Handle(fmt.Errorf("idemotel: read the dedup layout: %w", err))
			return 0, false
		}
		if !l.Daily() {
			return 0, false
		}
		parts, err := q.store.Partitions(qctx, pool)
		if err != nil {
			otel.Handle(fmt.Errorf("idemotel: read the daily partitions: %w", err))
			return 0, false
		}
		q.daily = true
		var today time.Time
		if err := pool.QueryRow(qctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today); err != nil {
			otel.Handle(fmt.Errorf("idemotel: read the daily partitions: %w", err))
			return 0, false
		}
		// The last day covered without a gap from the first day that
		// needs a partition (today, or DailyFrom while it is ahead): a hole
		// before the newest partition is where claims would fail first.
		have := make(map[time.Time]bool, len(parts))
		for _, p := range parts {
			have[p.Day] = true
		}
		now := time.Date(today.Year(), today.Month(), today.Day(), 0, 0, 0, 0, time.UTC)
		day := now
		if l.DailyFrom.After(day) {
			day = l.DailyFrom
		}
		for have[day] {
			day = day.AddDate(0, 0, 1)
		}
		q.days = int64(day.Sub(now)/(24*time.Hour)) - 1
	}
	return q.days, q.daily
}
