package idemotel

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/monitor"
)

// Defaults of MonitorConfig.
const (
	// MonitorIntervalDefault is how often a Monitor collects.
	MonitorIntervalDefault = 15 * time.Second
	// MonitorTimeoutDefault bounds one collection.
	MonitorTimeoutDefault = 10 * time.Second
	// RetentionDefault is the dedup retention a Monitor checks the oldest
	// processed-message records against when MonitorConfig.Retention is 0.
	RetentionDefault = 7 * 24 * time.Hour
)

// MonitorConfig configures a Monitor. Kafka.Brokers is required.
type MonitorConfig struct {
	// Config says where the tables and topics are (package monitor).
	monitor.Config
	// Interval is how often the Monitor collects. Defaults to
	// MonitorIntervalDefault.
	Interval time.Duration
	// Timeout bounds one collection, connecting included. Defaults to
	// MonitorTimeoutDefault.
	Timeout time.Duration
	// Retention is the dedup retention your purge promises (the consumers'
	// consumer.Config.Retention, or the age `idemkit dedup purge` is given in
	// a cron): it is exported as idemkit_dedup_retention_seconds for every
	// consumer, so that an alert compares the oldest record with it even
	// where nothing purges. Defaults to RetentionDefault; negative exports
	// no retention.
	Retention time.Duration
	// DeadLetterTopics, when set, are read each collection (dlq.List,
	// without payloads) into idemkit_dlq_messages{dlq_topic,state}: list
	// every destination of a dlq.Writer with Routes (Writer.Topics), so
	// that a message whose rounds went to several counts once.
	DeadLetterTopics []string
}

// Monitor exports, as gauges, what package monitor reads from PostgreSQL
// and Kafka: the state that holds whichever process runs the consumers,
// relays and servers, and whether any runs. Its Run collects in the
// background on one connection of its own, never during a scrape: a scrape
// serves the last collection, and idemkit_monitor_snapshot_age_seconds says
// how old it is. Run one Monitor per deployment (or one per replica: the
// alert rules take the max across them).
type Monitor struct {
	t         *Telemetry
	cfg       MonitorConfig
	mon       *monitor.Monitor
	poolCfg   *pgxpool.Config // the application pool's, for a pool of one connection of the Monitor's own
	retention float64

	ok, failed attrOpts

	mu        sync.Mutex
	snap      *monitor.Snapshot
	dead      map[string]map[dlq.State]int // per topic and state, as of snap
	at        time.Time                    // when snap was collected (in full or in part)
	okAt      time.Time                    // when the last collection without an error ended
	reg       metric.Registration
	attrCache map[string]attrOpts
}

// Monitor validates cfg (an error in cfg.Config wraps
// monitor.ErrInvalidConfig, any other ErrInvalidConfig) and returns a
// Monitor that reads with one connection of its own, made as pool makes
// its connections (the same settings and BeforeConnect/AfterConnect hooks;
// pool's connections are left to the application), and registers its
// gauges. Start it with Run; Close unregisters the gauges.
func (t *Telemetry) Monitor(pool *pgxpool.Pool, cfg *MonitorConfig) (*Monitor, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	case cfg == nil:
		return nil, fmt.Errorf("%w: nil monitor config", ErrInvalidConfig)
	case cfg.Interval < 0 || cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: Interval and Timeout must not be negative", ErrInvalidConfig)
	}
	c := *cfg
	c.Interval = cmp.Or(c.Interval, MonitorIntervalDefault)
	c.Timeout = cmp.Or(c.Timeout, MonitorTimeoutDefault)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.DeadLetterTopics = slices.Clone(c.DeadLetterTopics)
	mon, err := monitor.New(&c.Config)
	if err != nil {
		return nil, fmt.Errorf("idemotel: %w", err)
	}
	poolCfg := pool.Config() // a copy
	poolCfg.MaxConns, poolCfg.MinConns = 1, 0
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "idemkit monitor"
	m := &Monitor{t: t, cfg: c, mon: mon, poolCfg: poolCfg, attrCache: map[string]attrOpts{},
		ok: attrs(keyOutcome, "ok"), failed: attrs(keyOutcome, "failed")}
	if c.Retention > 0 {
		m.retention = c.Retention.Seconds()
	}
	in := &t.monitor
	for _, o := range []attrOpts{m.ok, m.failed} {
		in.collections.Add(context.Background(), 0, o.add...)
	}
	observed := []metric.Observable{t.consumer.lag, t.consumer.position, t.consumer.parked, t.consumer.parkedOldestAge,
		t.consumer.oldestRecordAge, t.consumer.partitionsAhead, t.consumer.retention, t.outbox.backlog, t.outbox.oldestAge,
		t.outbox.dead, t.outbox.held, t.http.stuck, t.dlq.messages, in.snapshotAge}
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		m.observe(o)
		return nil
	}, observed...)
	if err != nil {
		mon.Close()
		return nil, fmt.Errorf("idemotel: register the monitor's gauges: %w", err)
	}
	m.reg = reg
	return m, nil
}

// Run collects at once, then every Interval, until ctx ends; it then
// closes its connection and returns nil. A collection that fails in part
// (the database or Kafka unreachable, a table missing: a wrong schema, or
// not migrated) is counted in
// idemkit_monitor_collections_total{outcome="failed"} and reported to
// otel.Handle; what it read is served, the rest is left out. A Monitor
// whose last collection is older than twice its Interval plus its Timeout
// serves none of the tables' gauges (they would be stale), only
// idemkit_monitor_snapshot_age_seconds. A connection that broke is
// replaced at the next collection.
func (m *Monitor) Run(ctx context.Context) error {
	pool, err := pgxpool.NewWithConfig(ctx, m.poolCfg)
	if err != nil {
		return fmt.Errorf("idemotel: monitor: %w", err)
	}
	defer pool.Close()
	defer m.mon.Close()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := m.collect(ctx, pool)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			m.t.monitor.collections.Add(ctx, 1, m.failed.add...)
			otel.Handle(fmt.Errorf("idemotel: monitor: %w", err))
		default:
			m.t.monitor.collections.Add(ctx, 1, m.ok.add...)
		}
		t.Reset(m.cfg.Interval)
	}
}

// collect runs one collection and keeps what it read.
func (m *Monitor) collect(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	snap, err := m.mon.Collect(ctx, pool)
	if len(snap.Missing) > 0 {
		err = errors.Join(err, fmt.Errorf("schema %s has no table %s: a wrong Tables.Schema, or not migrated",
			m.mon.Tables().Schema, strings.Join(snap.Missing, ", ")))
	}
	var dead map[string]map[dlq.State]int
	if len(m.cfg.DeadLetterTopics) > 0 {
		l, lerr := dlq.List(ctx, pool, &dlq.ListConfig{Kafka: m.cfg.Kafka, Topics: m.cfg.DeadLetterTopics,
			Tables: m.mon.Tables(), NoPayload: true, DropHeaders: true, Window: &dlq.Window{}}) // counts only
		if lerr != nil {
			err = errors.Join(err, fmt.Errorf("read dead-letter topics: %w", lerr))
		} else {
			dead = map[string]map[dlq.State]int{}
			for t, c := range l.ByTopic {
				dead[t] = c.States
			}
		}
	}
	m.mu.Lock()
	m.snap, m.dead, m.at = snap, dead, time.Now()
	if err == nil {
		m.okAt = m.at
	}
	m.mu.Unlock()
	return err
}

// Close unregisters the gauges. Stop Run by cancelling its context.
func (m *Monitor) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reg == nil {
		return nil
	}
	err := m.reg.Unregister()
	m.reg = nil
	return err
}

// attrsOf returns the attributes of kv, made once.
func (m *Monitor) attrsOf(kv ...string) attrOpts {
	k := strings.Join(kv, "\x00")
	o, ok := m.attrCache[k]
	if !ok {
		o = attrs(kv...)
		m.attrCache[k] = o
	}
	return o
}

func (m *Monitor) observe(o metric.Observer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.snap
	if s == nil {
		return // nothing collected yet
	}
	if !m.okAt.IsZero() {
		o.ObserveFloat64(m.t.monitor.snapshotAge, time.Since(m.okAt).Seconds())
	}
	since := time.Since(m.at)
	if since > 2*m.cfg.Interval+m.cfg.Timeout {
		return // stale: another Monitor's, or none, is better than these
	}
	aged := func(d time.Duration) float64 { return (d + since).Seconds() }
	in := &m.t.consumer
	retained := map[string]bool{}
	for _, c := range s.Consumers {
		held := m.t.heldHere(c.Name, c.Topic) // those partitions are their runner's
		for _, p := range c.Partitions {
			if p.Lag == nil || held[p.Partition] {
				continue
			}
			opts := m.attrsOf(keyConsumer, c.Name, keyTopic, c.Topic, keyPartition, strconv.Itoa(p.Partition))
			o.ObserveInt64(in.lag, *p.Lag, opts.obs...)
			o.ObserveInt64(in.position, p.Position, opts.obs...)
		}
		base := m.attrsOf(keyConsumer, c.Name, keyTopic, c.Topic)
		o.ObserveInt64(in.parked, c.Parked, base.obs...)
		age := 0.0
		if c.OldestParkedAge != nil {
			age = aged(*c.OldestParkedAge)
		}
		o.ObserveFloat64(in.parkedOldestAge, age, base.obs...)
		if retained[c.Name] {
			continue
		}
		retained[c.Name] = true
		own := m.attrsOf(keyConsumer, c.Name)
		if c.OldestRecordAge != nil {
			o.ObserveFloat64(in.oldestRecordAge, aged(*c.OldestRecordAge), own.obs...)
		}
		if m.retention > 0 {
			o.ObserveFloat64(in.retention, m.retention, own.obs...)
		}
	}
	if s.DailyPartitionsAhead != nil { // one per schema: the partitions are the schema's
		o.ObserveInt64(in.partitionsAhead, int64(*s.DailyPartitionsAhead), m.attrsOf(keySchema, m.mon.Tables().Schema).obs...)
	}
	if ob := s.Outbox; ob != nil {
		table := m.attrsOf(keyTable, m.mon.Tables().Schema+"."+ob.Table)
		age := 0.0
		if ob.Backlog > 0 {
			age = aged(ob.OldestAge)
		}
		o.ObserveInt64(m.t.outbox.backlog, ob.Backlog, table.obs...)
		o.ObserveFloat64(m.t.outbox.oldestAge, age, table.obs...)
		o.ObserveInt64(m.t.outbox.dead, ob.Dead, table.obs...)
		o.ObserveInt64(m.t.outbox.held, ob.Held, table.obs...)
	}
	if r := s.Idempotency; r != nil {
		o.ObserveInt64(m.t.http.stuck, r.Stuck, m.attrsOf(keyTable, m.mon.Tables().Schema+"."+r.Table).obs...)
	}
	for _, topic := range m.cfg.DeadLetterTopics {
		if m.dead == nil {
			break
		}
		for _, st := range deadLetterStates {
			o.ObserveInt64(m.t.dlq.messages, int64(m.dead[topic][st]), m.attrsOf(keyDLQTopic, topic, keyState, string(st)).obs...)
		}
	}
}

// keySchema labels what belongs to a whole schema.
const keySchema = "schema"

// monitorInstruments are the Monitor's own instruments.
type monitorInstruments struct {
	collections metric.Int64Counter           // idemkit_monitor_collections_total
	snapshotAge metric.Float64ObservableGauge // idemkit_monitor_snapshot_age_seconds
}

func newMonitorInstruments(m metric.Meter) (monitorInstruments, error) {
	var in monitorInstruments
	var errs [2]error
	in.collections, errs[0] = m.Int64Counter("idemkit.monitor.collections", metric.WithUnit("{collection}"),
		metric.WithDescription("Monitor collections, by outcome: ok, failed (the gauges keep the last values)."))
	in.snapshotAge, errs[1] = m.Float64ObservableGauge("idemkit.monitor.snapshot_age", metric.WithUnit("s"),
		metric.WithDescription("Time since the Monitor's last collection without an error (absent before the first)."))
	return in, errors.Join(errs[:]...)
}

// deadLetterStates are the states the dead-letter gauge reports, each
// observed (0 when no message is in it) so that an alert compares with 0,
// not with nothing.
var deadLetterStates = []dlq.State{dlq.StateUnresolved, dlq.StateReplayed, dlq.StateApplied, dlq.StateExhausted,
	dlq.StateSuperseded, dlq.StateBeyondHorizon}
