package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// Message is a Kafka message with its dedup ID.
type Message struct {
	kafka.Message
	// ID is the message ID the runner claimed in the dedup store.
	ID string
	// Incarnation says which incarnation of the topic the message came from,
	// as this consumer knows it: 0 until the topic was deleted and created
	// again under the same name and the consumer was moved onto the new one
	// (see ErrTopicRecreated), then 1, 2, … Offsets of two incarnations are
	// unrelated, so coordinates (topic, partition, offset) identify a record
	// only together with it.
	Incarnation int64

	idErr  error // why no usable ID was found, when ID is empty
	skipTo int64 // > 0: not a message; the position may move to skipTo
	size   int64 // what the message acquired from the byte budget
}

// Runner consumes one topic with a consumer group and runs the handler once
// per message ID. Create it with New; Run it once.
type Runner struct {
	cfg    Config
	sem    chan struct{} // bounds the partitions processed at once
	obs    observers
	claims dedupq.Queuer // Store's claims, queued after BEGIN
	// setLocal bounds a transaction on the server (see runTx).
	setLocal string
	parkSQL  parkSQL // the parked-messages table's statements
	outages  *outage.Tracker
	states   partitionStates
	// now is the runner's clock, for its own timers only: when parked
	// messages fall due is decided on the database's clock, which every
	// runner of the group and `idemkit consumer parked retry` share.
	now func() time.Time
	// topicWait is how long a topic the brokers do not know is asked for
	// again before Run fails with ErrTopicNotFound (topicWaitDefault).
	topicWait time.Duration
	// maintain asks partitionLoop for a run now (a claim found no daily
	// partition for its day).
	maintain chan struct{}
}

// New validates cfg, applies its defaults and returns a Runner whose
// transactions run on pool. It does not connect to anything.
func New(pool *pgxpool.Pool, cfg *Config) (*Runner, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	case cfg == nil:
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	in := *cfg
	in.pool = pool
	c, err := in.withDefaults()
	if err != nil {
		return nil, err
	}
	obs, err := newObservers(c.Observers)
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: c, obs: obs, claims: dedupq.Of(c.Store), setLocal: pgsession.SetLocal(c.HandlerTimeout),
		parkSQL: newParkSQL(c.Store.Tables()), sem: make(chan struct{}, c.MaxPartitions), now: time.Now, maintain: make(chan struct{}, 1),
		topicWait: topicWaitDefault}
	r.outages = &outage.Tracker{Log: c.Logger.With("topic", c.Topic, "group", c.GroupID)}
	if len(obs.outage) > 0 {
		r.outages.OnStart, r.outages.OnEnd = obs.outageStarted, obs.outageEnded
	}
	return r, nil
}

// Pool returns the pool the runner's transactions run on, as given to New.
func (r *Runner) Pool() *pgxpool.Pool { return r.cfg.pool }

// Run consumes until ctx is cancelled, a message fails for good with no
// OnFailure to take it, a partition's stored position does not match the
// topic (ErrTopicRecreated, with RecreatedStop) or an outage outlasts
// Config.MaxOutage. It returns nil after a cancellation, and only after every
// goroutine it started has exited: fetching stops, a transaction in flight is
// rolled back (its messages come back later) or, if its handlers had already
// succeeded, committed; the last positions go to Kafka; what committed stays
// committed.
//
// A PostgreSQL or Kafka server that cannot be reached (at start or later) is
// waited out with backoff: Run does not return for it; each outage is logged
// when it starts and when it ends, with its duration.
func (r *Runner) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	log := r.cfg.Logger.With("topic", r.cfg.Topic, "group", r.cfg.GroupID)

	if err := r.pgWaiter("postgres schema").Do(ctx, r.requireSchema); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// The runner bounds its own transactions; what else uses the pool
	// (the handler's own sessions, other code) depends on its settings.
	pgsession.Check(ctx, r.cfg.pool, &r.cfg.pool.Config().ConnConfig.Config, log, "consumer "+r.cfg.GroupID+"/"+r.cfg.Topic)
	if err := r.pgWaiter("postgres dedup layout").Do(ctx, func(ctx context.Context) error {
		_, err := r.claims.Layout(ctx, r.cfg.pool, 0) // bounded by the waiter
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	client, closeClient, err := r.client()
	if err != nil {
		return err
	}
	defer closeClient()
	if err := r.do(ctx, "kafka metadata", func(ctx context.Context) error { return r.requireTopic(ctx, client) }); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	dialer, err := r.cfg.Kafka.Dialer()
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                     r.cfg.GroupID,
		Brokers:                r.cfg.Kafka.Brokers,
		Dialer:                 dialer,
		Topics:                 []string{r.cfg.Topic},
		StartOffset:            r.cfg.StartOffset,
		SessionTimeout:         r.cfg.SessionTimeout,
		HeartbeatInterval:      r.cfg.HeartbeatInterval,
		RebalanceTimeout:       r.cfg.RebalanceTimeout,
		JoinGroupBackoff:       time.Second,
		WatchPartitionChanges:  true,
		PartitionWatchInterval: PartitionWatchIntervalDefault,
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}

	var (
		wg    sync.WaitGroup
		fatal error
		once  sync.Once
	)
	fail := func(err error) {
		once.Do(func() { fatal = err; cancel(err) })
	}
	// Closing the group ends the current generation, whose context the
	// partition workers watch; it returns once they have exited.
	closed := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		_ = group.Close()
		close(closed)
	}()
	if r.cfg.Retention > 0 {
		wg.Go(func() { r.purgeLoop(ctx, log) })
	}
	wg.Go(func() { r.partitionLoop(ctx, log) })

	groupWait := r.waiter("kafka consumer group")
	defer groupWait.Stop()
	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			if permanentGroupError(err) {
				// Joining again would fail the same way for ever.
				fail(fmt.Errorf("consumer: join group %s: %w", r.cfg.GroupID, err))
				break
			}
			// kafka-go backs off and joins again; say why we wait, once per
			// outage (a rebalance in progress is the ordinary case).
			switch {
			case errors.Is(err, kafka.RebalanceInProgress):
				log.Debug("consumer group: rebalance in progress", "err", err)
			case !groupWait.InOutage():
				log.Warn("consumer group: waiting for a generation", "err", err)
			}
			if werr := groupWait.Wait(ctx, err); werr != nil && ctx.Err() == nil && errors.Is(werr, retry.ErrOutage) {
				fail(werr)
				break
			}
			continue
		}
		groupWait.Ok()
		r.startGeneration(ctx, gen, client, fail)
	}
	cancel(nil)
	<-closed
	wg.Wait()
	return fatal
}

// unknownPartitionWait is how long an assigned partition that Kafka does
// not know yet is waited for before the runner gives up.
const unknownPartitionWait = 30 * time.Second

// permanentGroupError reports whether joining the group failed for a reason
// that another try cannot change: authorization, refused credentials or TLS
// (kafkaconn.Classify: a coordinator with another certificate than the
// bootstrap broker, a rotated CA), a session timeout outside the broker's
// bounds, an invalid group ID.
func permanentGroupError(err error) bool {
	if kafkaconn.Classify(err) != nil {
		return true
	}
	for _, e := range []kafka.Error{kafka.GroupAuthorizationFailed, kafka.TopicAuthorizationFailed,
		kafka.ClusterAuthorizationFailed, kafka.SASLAuthenticationFailed, kafka.InvalidSessionTimeout,
		kafka.InvalidGroupId, kafka.InconsistentGroupProtocol} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// waiter returns an outage waiter for one loop of the runner.
// All of them report to the runner's one tracker: an outage that every
// partition meets is logged once, not once per partition. Kafka requests
// bound themselves (the client's timeouts); see pgWaiter for PostgreSQL.
func (r *Runner) waiter(op string) *outage.Waiter {
	return &outage.Waiter{Op: "consumer " + r.cfg.GroupID + "/" + r.cfg.Topic + ": " + op,
		Max: r.cfg.MaxOutage, Shared: r.outages}
}

// pgWaiter is waiter for PostgreSQL operations: each try is bounded as a
// transaction is, so that a connection gone silent is given up on.
func (r *Runner) pgWaiter(op string) *outage.Waiter {
	w := r.waiter(op)
	w.Bound = txBound(r.cfg.HandlerTimeout)
	return w
}

// do runs op with a waiter of its own until it succeeds (see
// outage.Waiter.Do); a wait that ctx ends leaves the runner's outage.
func (r *Runner) do(ctx context.Context, op string, f func(ctx context.Context) error) error {
	return r.run(ctx, r.waiter(op), f)
}

// doPG is do for a PostgreSQL operation (see pgWaiter).
func (r *Runner) doPG(ctx context.Context, op string, f func(ctx context.Context) error) error {
	return r.run(ctx, r.pgWaiter(op), f)
}

func (r *Runner) run(ctx context.Context, w *outage.Waiter, f func(ctx context.Context) error) error {
	defer w.Stop()
	return w.Do(ctx, f)
}

// purgeLoop deletes this consumer's dedup records older than
// Config.Retention, every PurgeInterval, until ctx ends.
func (r *Runner) purgeLoop(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(r.cfg.PurgeInterval)
	defer t.Stop()
	for {
		began := time.Now()
		n, err := r.cfg.Store.PurgeConsumer(ctx, r.cfg.pool, r.cfg.Name, r.cfg.Retention, 0)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("dedup retention purge failed; next try at the next interval", "err", err)
		case n > 0:
			log.Info("dedup retention purge", "deleted", n, "older_than", r.cfg.Retention)
		}
		if err == nil {
			r.obs.purged(ctx, &PurgeEvent{Deleted: n, Duration: time.Since(began)})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// partitionLoop keeps the daily layout's partitions (dedup.Store.
// MaintainPartitions: created ahead, dropped behind) at start, every
// PurgeInterval and when a claim found none for its day, until ctx ends.
// With the flat layout each run only reads the layout.
func (r *Runner) partitionLoop(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(r.cfg.PurgeInterval)
	defer t.Stop()
	for {
		ch, err := r.cfg.Store.MaintainPartitions(ctx, r.cfg.pool)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("dedup daily partitions: maintenance failed; next try at the next interval", "err", err)
		case len(ch.Created) > 0 || len(ch.Dropped) > 0:
			log.Info("dedup daily partitions maintained", "created", days(ch.Created), "dropped", days(ch.Dropped))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.maintain:
		}
	}
}

// askMaintenance asks partitionLoop for a run now.
func (r *Runner) askMaintenance() {
	select {
	case r.maintain <- struct{}{}:
	default:
	}
}

// days formats days for a log.
func days(ds []time.Time) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Format(time.DateOnly)
	}
	return out
}

// ErrNotMigrated means the store's schema lacks migration versions the
// runner needs: run `idemkit migrate up` (or migrate.Migrator.Up) with the
// store's schema and tables first.
var ErrNotMigrated = fmt.Errorf("consumer: %w", idemkit.ErrNotMigrated)

// schemaVersions are the migration versions the runner reads and writes:
// the baseline's tables (1).
var schemaVersions = []int{1}

// requireSchema checks, before anything is consumed, that the store's
// schema has every migration the runner needs, so that a schema behind is
// an error at start rather than at the first message that needs it.
func (r *Runner) requireSchema(ctx context.Context) error {
	tables := r.cfg.Store.Tables()
	m, err := migrate.New(r.cfg.pool, &migrate.Config{Tables: tables})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	applied, err := m.Versions(ctx)
	if err != nil {
		return fmt.Errorf("consumer: check the schema: %w", err)
	}
	var missing []int
	for _, v := range schemaVersions {
		if !slices.Contains(applied, v) {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: schema %s lacks migration versions %v: run `idemkit migrate up -schema %s` (or migrate.Migrator.Up) first",
			ErrNotMigrated, tables.Schema, missing, tables.Schema)
	}
	return nil
}

// ErrTopicNotFound means the topic to consume does not exist. The runner
// never creates topics: create it (with the partition count you need) first.
var ErrTopicNotFound = errors.New("consumer: topic does not exist")

// kafkaRequestTimeout bounds one request of the runner's Kafka clients
// (metadata, offsets, a fetch, which waits 250ms at most for records): a
// request on a connection gone silent is given up after it.
const kafkaRequestTimeout = 10 * time.Second

// client returns a Kafka client that talks to the brokers as Config.Kafka
// says, and a function that closes its connections.
func (r *Runner) client() (*kafka.Client, func(), error) {
	t, err := r.cfg.Kafka.Transport()
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: %w", err)
	}
	return &kafka.Client{Addr: r.cfg.Kafka.Addr(), Timeout: kafkaRequestTimeout, Transport: t}, t.CloseIdleConnections, nil
}

// topicWaitDefault is how long a runner asks again for a topic the brokers
// do not know: a topic created a moment ago may not have reached the broker
// asked yet.
const topicWaitDefault = 10 * time.Second

// requireTopic checks that the topic exists before joining the group, so
// that a typo or a missing topic is an error, not a silent wait. A topic
// unknown to the broker asked is asked for again for topicWait.
func (r *Runner) requireTopic(ctx context.Context, client *kafka.Client) error {
	var since time.Time
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.cfg.Topic}})
		if err != nil {
			return fmt.Errorf("consumer: metadata for topic %s: %w", r.cfg.Topic, r.cfg.Kafka.Wrap(err))
		}
		if len(md.Topics) == 1 && !errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
			if err := md.Topics[0].Error; err != nil {
				return fmt.Errorf("consumer: metadata for topic %s: %w", r.cfg.Topic, err)
			}
			return nil
		}
		if since.IsZero() {
			since = time.Now()
			r.cfg.Logger.Info(TopicUnknownMsg, "topic", r.cfg.Topic, "wait", r.topicWait)
		}
		if time.Since(since) >= r.topicWait {
			return fmt.Errorf("%w: %s (create it first; idemkit never creates topics)", ErrTopicNotFound, r.cfg.Topic)
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// TopicUnknownMsg is logged (Info) when the brokers do not know the topic
// to consume: the runner asks again for a few seconds (a topic created a
// moment ago may not have reached every broker) before Run fails with
// ErrTopicNotFound.
const TopicUnknownMsg = "the brokers do not know the topic; asking again before giving up"

// startGeneration starts the generation's work: one goroutine of the
// generation reads the stored positions and the partitions' log ranges, then
// starts one worker per assigned partition and the committer. Each partition
// starts at its PostgreSQL position when it has one (Kafka's committed offset
// when that is ahead), after checking it against the partition's log (see
// checkStart); a start ahead of Kafka's committed offset is committed to
// Kafka at once, so that lag tooling sees the work as done. The lookups wait
// out outages; the generation ending (a rebalance) stops them.
func (r *Runner) startGeneration(ctx context.Context, gen *kafka.Generation, client *kafka.Client, fail func(error)) {
	assigned := gen.Assignments[r.cfg.Topic]
	if len(r.obs.rebalance) > 0 {
		ids := make([]int, len(assigned))
		for i, a := range assigned {
			ids[i] = a.ID
		}
		slices.Sort(ids)
		r.obs.rebalanced(ctx, &RebalanceEvent{Generation: gen.ID, Partitions: ids})
	}
	if len(assigned) == 0 {
		// Nothing for this member: other members may hold every partition,
		// or the group formed while the topic was missing (deleted and
		// created again under the same partition count, which kafka-go's
		// partition watch does not notice). In the latter case nobody would
		// ever consume it: watch for it and rejoin.
		gen.Start(func(genCtx context.Context) { r.watchUnassigned(genCtx, client) })
		return
	}
	// A function started on the generation ends the generation when it
	// returns: this one stays until the generation ends.
	gen.Start(func(genCtx context.Context) {
		defer func() { <-genCtx.Done() }()
		lookup, stop := context.WithCancel(ctx)
		defer stop()
		defer context.AfterFunc(genCtx, stop)()
		starts, err := r.starts(lookup, client, assigned)
		if err != nil {
			if lookup.Err() == nil {
				fail(err)
			}
			return
		}
		if genCtx.Err() != nil {
			// The generation ended during the lookups: functions started on
			// it now would run unowned. The next generation starts over.
			return
		}
		commits := newCommitter(gen, r.cfg.Topic, offsetCommitInterval, r.cfg.Logger.With("topic", r.cfg.Topic), &r.obs)
		commits.workers.Add(len(assigned))
		budget := max(r.cfg.MaxBufferedBytes/int64(len(assigned)), 1)
		for _, a := range assigned {
			st := starts[a.ID]
			w := &worker{r: r, commits: commits, partition: a.ID, start: st.offset, incarnation: st.incarnation, epoch: st.epoch,
				budget: budget, fail: fail, log: r.cfg.Logger.With("topic", r.cfg.Topic, "partition", a.ID)}
			r.obs.assigned(ctx, &AssignEvent{Topic: r.cfg.Topic, Partition: a.ID, Start: st.offset})
			if st.commit {
				commits.mark(a.ID, st.offset)
			}
			gen.Start(func(genCtx context.Context) {
				defer commits.workers.Done()
				w.run(ctx, genCtx)
			})
		}
		gen.Start(commits.run)
		ids := make([]int, len(assigned))
		for i, a := range assigned {
			ids[i] = a.ID
		}
		gen.Start(func(genCtx context.Context) { r.refreshLogEnds(genCtx, client, ids) })
	})
}

// watchUnassigned returns (ending the generation, so that the group forms
// again) once the topic has partitions and no member of the group holds any
// of them.
func (r *Runner) watchUnassigned(genCtx context.Context, client *kafka.Client) {
	t := time.NewTicker(PartitionWatchIntervalDefault)
	defer t.Stop()
	for {
		select {
		case <-genCtx.Done():
			return
		case <-t.C:
		}
		parts, err := kafkaoffsets.Partitions(genCtx, client, r.cfg.Topic)
		if err != nil || len(parts) == 0 {
			continue
		}
		g, err := kafkaoffsets.Describe(genCtx, client, r.cfg.GroupID)
		if err != nil || g.Assigned[r.cfg.Topic] > 0 {
			continue
		}
		r.cfg.Logger.Warn("the topic has partitions that no member of the group holds (created while the group formed); joining again",
			"topic", r.cfg.Topic, "group", r.cfg.GroupID, "partitions", len(parts))
		return
	}
}

// starts reads where each assigned partition starts.
func (r *Runner) starts(ctx context.Context, client *kafka.Client, assigned []kafka.PartitionAssignment) (map[int]partitionStart, error) {
	partitions := make([]int, len(assigned))
	for i, a := range assigned {
		partitions[i] = a.ID
	}
	var (
		positions = map[int]dedup.Position{}
		ranges    map[int]kafkaoffsets.Range
	)
	err := r.doPG(ctx, "postgres read positions", func(ctx context.Context) error {
		list, err := r.cfg.Store.ListPositions(ctx, r.cfg.pool, r.cfg.Name, r.cfg.Topic)
		for _, p := range list {
			positions[p.Partition] = p
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: read positions: %w", err)
	}
	unknownSince := time.Time{}
	err = r.do(ctx, "kafka list offsets", func(ctx context.Context) error {
		for {
			var err error
			ranges, err = kafkaoffsets.LogRange(ctx, client, r.cfg.Topic, partitions...)
			// A partition just added may not be known to every broker yet:
			// Kafka calls that retriable. Give it a while.
			if !errors.Is(err, kafka.UnknownTopicOrPartition) || ctx.Err() != nil {
				return err
			}
			if unknownSince.IsZero() {
				unknownSince = time.Now()
			} else if time.Since(unknownSince) > unknownPartitionWait {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	starts := make(map[int]partitionStart, len(assigned))
	for _, a := range assigned {
		pos, ok := positions[a.ID]
		var st partitionStart
		err := r.do(ctx, "postgres and kafka check position", func(ctx context.Context) error {
			var err error
			st, err = r.checkStart(ctx, client, a.ID, pos, ok, a.Offset, ranges[a.ID])
			return err
		})
		if err != nil {
			return nil, err
		}
		starts[a.ID] = st
	}
	return starts, nil
}
