package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// The servers, named as for the tests.
const (
	envDatabaseURL  = testenv.EnvDatabaseURL
	envKafkaBrokers = testenv.EnvKafkaBrokers
)

// bench holds the servers and what the run created, to remove it at the end.
type bench struct {
	o        *options
	dbURL    string
	brokers  []string
	admin    *pgxpool.Pool
	client   *kafka.Client
	runID    string
	kafkaPID int

	round int // the round running now, from 1

	peerBin string // the Watermill peer's binary
	wal     *walMeter

	schemas []string
	topics  []string
	groups  []string
	tmpDirs []string
}

// result is one scenario's figures.
type result struct {
	Scenario   string        `json:"scenario"`
	Title      string        `json:"title"`
	Messages   int64         `json:"messages"`
	Seconds    float64       `json:"seconds"`
	Rate       float64       `json:"msgs_per_s"`
	PeakRSSMiB float64       `json:"peak_rss_mib"`
	ProcessCPU float64       `json:"process_cpu_s"` // the child's whole life
	Txs        int64         `json:"txs"`
	Duplicates int64         `json:"duplicates"`
	Segments   segments      `json:"segments"`
	CPU        cpuUsage      `json:"cpu"`
	WAL        *walUsage     `json:"wal,omitempty"`
	Steady     *steadyResult `json:"steady,omitempty"`
	// Rounds holds every round's msgs/s; the other fields are the median round's.
	Rounds []float64 `json:"rounds"`
}

// steadyResult is the steady-rate phase.
type steadyResult struct {
	TargetRate   int     `json:"target_rate"`
	Produced     int     `json:"produced"`
	ProducedRate float64 `json:"produced_rate"`
	DrainMs      float64 `json:"drain_ms"` // last effect commit after the last produce returned
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	FetchP50Ms   float64 `json:"fetch_p50_ms"` // produce→fetch
	FetchP99Ms   float64 `json:"fetch_p99_ms"`
	KeptUp       bool    `json:"kept_up"`
}

func runBench(ctx context.Context, o *options) (err error) {
	dbURL := strings.TrimSpace(os.Getenv(envDatabaseURL))
	var brokers []string
	for _, b := range strings.Split(os.Getenv(envKafkaBrokers), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if dbURL == "" || len(brokers) == 0 {
		return fmt.Errorf("set %s and %s (scripts/bench starts the development servers and sets them)",
			envDatabaseURL, envKafkaBrokers)
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("parse %s: %w", envDatabaseURL, err)
	}
	pcfg.MaxConns = 2
	admin, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer admin.Close()
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	b := &bench{o: o, dbURL: dbURL, brokers: brokers, admin: admin, wal: &walMeter{},
		client:   &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second},
		runID:    hex.EncodeToString(id[:]),
		kafkaPID: findKafkaPID()}
	defer b.cleanup(ctx)

	rep := &report{o: o, brokers: brokers}
	if err := b.describe(ctx, rep); err != nil {
		return err
	}
	defer func() {
		// Print what was measured, also when a later scenario failed.
		rep.print(os.Stdout)
		if o.jsonPath != "" {
			if jerr := rep.writeJSON(o.jsonPath); jerr != nil && err == nil {
				err = jerr
			}
		}
	}()

	sel := o.selected()
	var throughput, steady, scale []*scenario
	for _, sc := range sel {
		switch sc.kind {
		case kindSteady:
			steady = append(steady, sc)
		case kindScale:
			scale = append(scale, sc)
		default:
			throughput = append(throughput, sc)
		}
		if sc.peer && b.peerBin == "" {
			if b.peerBin, err = b.buildPeer(ctx); err != nil {
				return err
			}
		}
	}
	b.wal.setup(ctx, b.admin, b.name("_", "walinspect"))
	rep.walScope = b.wal.scope()
	var backlog string
	for _, sc := range throughput {
		if sc.kind == kindConsumer || sc.kind == kindPeer {
			backlog, err = b.prepareBacklog(ctx, rep)
			if err != nil {
				return err
			}
			break
		}
	}
	// Rounds interleave the scenarios, so that a slow spell of the shared
	// machine falls on all of them; each figure is its scenario's median
	// round. Every other round runs them in reverse order (A B C, C B A, …):
	// a scenario run first in every round met a machine still busy with the
	// round before, or a broker not yet warm, each time.
	rounds := map[string][]*result{}
	defer func() { // also after a failure: report what was measured
		rep.results = rep.results[:0]
		for _, sc := range throughput {
			if len(rounds[sc.name]) > 0 {
				rep.results = append(rep.results, median(rounds[sc.name]))
			}
		}
	}()
	for round := 1; round <= o.repeat && len(throughput) > 0; round++ {
		b.round = round
		for _, sc := range roundOrder(throughput, round) {
			progress("%s: round %d of %d", sc.name, round, o.repeat)
			var r *result
			switch sc.kind {
			case kindConsumer, kindPeer:
				r, err = b.runConsumer(ctx, sc, backlog)
			case kindPG:
				r, err = b.runPG(ctx, sc)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			rounds[sc.name] = append(rounds[sc.name], r)
			progress("%s: %.0f msgs/s, peak RSS %.1f MiB%s", sc.name, r.Rate, r.PeakRSSMiB, allocsPerMessage(r))
		}
	}
	// Scaling: the process counts interleave within each round.
	scaleRounds := map[int][]*scaleResult{}
	defer func() {
		rep.scale = rep.scale[:0]
		for _, n := range o.processes {
			if len(scaleRounds[n]) > 0 {
				rep.scale = append(rep.scale, medianScale(scaleRounds[n]))
			}
		}
	}()
	for round := 1; round <= o.repeat && len(scale) > 0; round++ {
		b.round = round
		for _, sc := range scale {
			for _, n := range o.processes {
				progress("%s: %d processes, round %d of %d", sc.name, n, round, o.repeat)
				r, err := b.runScale(ctx, sc, n)
				if err != nil {
					return fmt.Errorf("%s with %d processes: %w", sc.name, n, err)
				}
				scaleRounds[n] = append(scaleRounds[n], r)
				progress("%s: %d processes: %.0f msgs/s (%.0f per process)", sc.name, n, r.Rate, r.PerProcess)
			}
		}
	}
	// Steady rates: a latency run, not a throughput one, so once per mode and
	// rate; the modes interleave at each rate.
	for _, rate := range o.rates {
		for _, sc := range steady {
			progress("%s: %d msgs/s for %s", sc.name, rate, o.steady)
			r, err := b.runSteady(ctx, sc, rate)
			if err != nil {
				return fmt.Errorf("%s at %d msgs/s: %w", sc.name, rate, err)
			}
			rep.steady = append(rep.steady, r)
			s := r.Steady
			progress("%s at %d msgs/s: p50 %.1f ms, p99 %.1f ms, max %.1f ms, kept up: %t",
				sc.name, rate, s.P50Ms, s.P99Ms, s.MaxMs, s.KeptUp)
		}
	}
	return nil
}

// roundOrder returns the scenarios in the order round (from 1) runs them:
// as given in odd rounds, reversed in even ones. A consumer scenario stays
// next to its PostgreSQL-alone counterpart either way.
func roundOrder(scs []*scenario, round int) []*scenario {
	if round%2 == 1 {
		return scs
	}
	rev := slices.Clone(scs)
	slices.Reverse(rev)
	return rev
}

// buildPeer builds the Watermill peer (test/peers/watermill, its own module
// and workspace) unless -watermill names a binary.
func (b *bench) buildPeer(ctx context.Context) (string, error) {
	if b.o.watermill != "" {
		return b.o.watermill, nil
	}
	dir, err := peerDir()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "idemkit-bench-")
	if err != nil {
		return "", err
	}
	b.tmpDirs = append(b.tmpDirs, tmp)
	bin := filepath.Join(tmp, "watermill-peer")
	progress("building the Watermill peer (%s)", dir)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the Watermill peer in %s (or pass -watermill): %w", dir, err)
	}
	return bin, nil
}

// peerDir finds test/peers/watermill from the working directory (the
// repository, or any directory in it: scripts/bench runs in test/).
func peerDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		for _, rel := range []string{"peers/watermill", "test/peers/watermill"} {
			p := filepath.Join(d, rel)
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return p, nil
			}
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("test/peers/watermill not found above %s: run from the repository or pass -watermill", wd)
		}
	}
}

// median returns the round with the median rate, carrying every round's rate
// and the highest peak RSS of all rounds.
func median(rs []*result) *result {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b *result) int { return cmp.Compare(a.Rate, b.Rate) })
	m := *sorted[len(sorted)/2]
	for _, r := range rs {
		m.Rounds = append(m.Rounds, r.Rate)
		m.PeakRSSMiB = max(m.PeakRSSMiB, r.PeakRSSMiB)
	}
	return &m
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench] "+format+"\n", args...)
}

// describe records the versions and settings the figures depend on.
func (b *bench) describe(ctx context.Context, rep *report) error {
	err := b.admin.QueryRow(ctx, `SELECT version(), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('shared_buffers')`).
		Scan(&rep.pgVersion, &rep.pgFsync, &rep.pgSyncCommit, &rep.pgSharedBuffers)
	if err != nil {
		return fmt.Errorf("PostgreSQL: %w", err)
	}
	rep.kafkaLocal = b.kafkaPID > 0
	return nil
}

// name returns a name unique to this run, usable as a schema, topic or group.
func (b *bench) name(sep, suffix string) string {
	return "idemkit" + sep + "bench" + sep + b.runID + sep + strings.ReplaceAll(suffix, "-", sep)
}

// newSchema creates a fresh schema with idemkit's tables and the business
// table.
func (b *bench) newSchema(ctx context.Context, scenario string) (string, error) {
	schema := b.name("_", scenario)
	if _, err := b.admin.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", fmt.Errorf("create schema: %w", err)
	}
	b.schemas = append(b.schemas, schema)
	m, err := migrate.New(b.admin, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return "", err
	}
	if _, err := m.Up(ctx); err != nil {
		return "", err
	}
	if _, err := b.admin.Exec(ctx, fmt.Sprintf(accountsDDL, pgx.Identifier{schema, "accounts"}.Sanitize())); err != nil {
		return "", fmt.Errorf("create accounts: %w", err)
	}
	return schema, nil
}

// newTopic creates a fresh topic and waits until every partition has a leader.
func (b *bench) newTopic(ctx context.Context, suffix string) (string, error) {
	topic := b.name("-", suffix)
	resp, err := b.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: b.o.partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return "", fmt.Errorf("create topic %s: %w", topic, err)
	}
	b.topics = append(b.topics, topic)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := testenv.WaitTopic(wctx, b.client, topic, b.o.partitions); err != nil {
		return "", err
	}
	return topic, nil
}

// cleanup drops the schemas, deletes the topics and consumer groups this run
// created, also after an error or an interrupt.
func (b *bench) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, s := range b.schemas {
		if _, err := b.admin.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{s}.Sanitize()+` CASCADE`); err != nil {
			progress("cleanup: drop schema %s: %v", s, err)
		}
	}
	if len(b.groups) > 0 {
		resp, err := b.client.DeleteGroups(ctx, &kafka.DeleteGroupsRequest{GroupIDs: b.groups})
		if err == nil {
			errs := make([]error, 0, len(resp.Errors))
			for _, e := range resp.Errors {
				errs = append(errs, e)
			}
			err = errors.Join(errs...)
		}
		if err != nil {
			progress("cleanup: delete consumer groups: %v", err)
		}
	}
	if len(b.topics) > 0 {
		resp, err := b.client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: b.topics})
		if err == nil {
			errs := make([]error, 0, len(resp.Errors))
			for _, e := range resp.Errors {
				errs = append(errs, e)
			}
			err = errors.Join(errs...)
		}
		if err != nil {
			progress("cleanup: delete topics: %v", err)
		}
	}
	for _, d := range b.tmpDirs {
		_ = os.RemoveAll(d)
	}
	b.wal.cleanup(ctx, b.admin)
	if t, ok := kafka.DefaultTransport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
}

// checkpoint flushes dirty buffers before a scenario, so that no scenario
// pays for the writes of the previous one.
func (b *bench) checkpoint(ctx context.Context) {
	if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
		progress("CHECKPOINT failed (figures may include a previous scenario's writes): %v", err)
	}
}

func backlogMessage(prefix string, i, accounts int) kafka.Message {
	return kafka.Message{
		Key:     []byte(accountKey(accountOf(i, accounts))),
		Value:   strconv.AppendInt(nil, amountOf(i), 10),
		Headers: []kafka.Header{{Key: "message-id", Value: []byte(prefix + strconv.Itoa(i))}},
	}
}

// prepareBacklog creates the backlog topic and produces -messages to it; the
// consumer scenarios each read all of it with their own group.
func (b *bench) prepareBacklog(ctx context.Context, rep *report) (string, error) {
	topic, err := b.newTopic(ctx, "backlog")
	if err != nil {
		return "", err
	}
	progress("producing %d messages to %s", b.o.messages, topic)
	w := &kafka.Writer{Addr: kafka.TCP(b.brokers...), Topic: topic, Balancer: accountBalancer,
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: 2 * time.Millisecond}
	start := time.Now()
	const chunk = 10_000
	for from := 0; from < b.o.messages; from += chunk {
		msgs := make([]kafka.Message, 0, chunk)
		for i := from; i < min(from+chunk, b.o.messages); i++ {
			msgs = append(msgs, backlogMessage("m-", i, b.o.accounts))
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			_ = w.Close()
			return "", fmt.Errorf("produce backlog: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return "", fmt.Errorf("produce backlog: %w", err)
	}
	rep.backlogSeconds = time.Since(start).Seconds()
	return topic, nil
}

func (b *bench) spec(sc *scenario, schema, topic, group string, messages int) *childSpec {
	batch := 1
	if sc.batched || (sc.kind == kindPG && sc.pg != pgPerMessage) {
		batch = b.o.batch
	}
	spec := &childSpec{Scenario: sc.name, DatabaseURL: b.dbURL, Brokers: b.brokers, Schema: schema,
		Topic: topic, Group: group, Messages: messages, Partitions: b.o.partitions, Batch: batch,
		Accounts: b.o.accounts, KafkaPID: b.kafkaPID, Timeout: b.o.timeout}
	if b.o.profileDir != "" {
		spec.CPUProfile = filepath.Join(b.o.profileDir, sc.name+".cpu.prof")
	}
	return spec
}

// tag names a scenario's round: its schema and consumer group.
func (b *bench) tag(sc *scenario) string { return fmt.Sprintf("%s-r%d", sc.name, b.round) }

func (b *bench) runConsumer(ctx context.Context, sc *scenario, topic string) (*result, error) {
	schema, err := b.newSchema(ctx, b.tag(sc))
	if err != nil {
		return nil, err
	}
	group := b.name("-", b.tag(sc))
	b.groups = append(b.groups, group)
	b.checkpoint(ctx)
	wal := b.wal.begin(ctx, b.admin)
	run, err := b.runChild(ctx, sc, b.spec(sc, schema, topic, group, b.o.messages), nil)
	if err != nil {
		return nil, err
	}
	r := run.result(sc)
	r.WAL = b.wal.end(ctx, b.admin, wal, schema, r.Messages)
	if err := b.verifyRun(ctx, sc, schema, topic, group, b.o.messages); err != nil {
		return nil, err
	}
	return r, nil
}

// verifyRun checks a run's effects; the peer keeps no PostgreSQL position,
// so for it the group's committed Kafka offsets must cover every message.
func (b *bench) verifyRun(ctx context.Context, sc *scenario, schema, topic, group string, n int) error {
	if !sc.peer {
		return b.verify(ctx, schema, int64(n), sumAmounts(n), true)
	}
	if err := b.verify(ctx, schema, int64(n), sumAmounts(n), false); err != nil {
		return err
	}
	return b.verifyOffsets(ctx, topic, group, int64(n))
}

// verifyOffsets checks that group committed offsets past n messages of topic.
func (b *bench) verifyOffsets(ctx context.Context, topic, group string, n int64) error {
	parts := make([]int, b.o.partitions)
	for i := range parts {
		parts[i] = i
	}
	resp, err := b.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group,
		Topics: map[string][]int{topic: parts}})
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		return fmt.Errorf("verify: committed offsets: %w", err)
	}
	var sum int64
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return fmt.Errorf("verify: committed offset of partition %d: %w", p.Partition, p.Error)
		}
		sum += max(p.CommittedOffset, 0)
	}
	if sum != n {
		return fmt.Errorf("verify: WRONG RESULT: committed offsets sum to %d, want %d", sum, n)
	}
	return nil
}

func (b *bench) runPG(ctx context.Context, sc *scenario) (*result, error) {
	schema, err := b.newSchema(ctx, b.tag(sc))
	if err != nil {
		return nil, err
	}
	b.checkpoint(ctx)
	wal := b.wal.begin(ctx, b.admin)
	// The consumer's names, in form and length: the consumer name and the
	// topic are in every dedup row and key, so shorter ones would make
	// PostgreSQL alone write less than the consumer does (they once were
	// "pg-alone": 72-byte rows against the consumer's 120).
	topic, group := b.name("-", "backlog"), b.name("-", b.tag(sc))
	run, err := b.runChild(ctx, sc, b.spec(sc, schema, topic, group, b.o.messages), nil)
	if err != nil {
		return nil, err
	}
	r := run.result(sc)
	r.WAL = b.wal.end(ctx, b.admin, wal, schema, r.Messages)
	if err := b.verify(ctx, schema, int64(b.o.messages), sumAmounts(b.o.messages), sc.pg != pgMinimal); err != nil {
		return nil, err
	}
	return r, nil
}

// steadyKeptUp is the most the last effect may trail the last produce for
// the consumer to count as having kept up.
const steadyKeptUp = time.Second

func (b *bench) runSteady(ctx context.Context, sc *scenario, rate int) (*result, error) {
	tag := fmt.Sprintf("%s-%d", sc.name, rate)
	schema, err := b.newSchema(ctx, tag)
	if err != nil {
		return nil, err
	}
	topic, err := b.newTopic(ctx, tag)
	if err != nil {
		return nil, err
	}
	group := b.name("-", tag)
	b.groups = append(b.groups, group)
	b.checkpoint(ctx)
	var prod steadyProduction
	wal := b.wal.begin(ctx, b.admin)
	run, err := b.runChild(ctx, sc, b.spec(sc, schema, topic, group, -1), func(ctx context.Context, stdin io.Writer) error {
		var err error
		if prod, err = b.produceSteady(ctx, topic, rate); err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdin, "expect %d\n", prod.n)
		return err
	})
	if err != nil {
		return nil, err
	}
	r := run.result(sc)
	r.WAL = b.wal.end(ctx, b.admin, wal, schema, r.Messages)
	if err := b.verifyRun(ctx, sc, schema, topic, group, prod.n); err != nil {
		return nil, err
	}
	s := &steadyResult{TargetRate: rate, Produced: prod.n, ProducedRate: float64(prod.n) / prod.elapsed.Seconds()}
	drain := max(run.res.LastEffect.Sub(prod.last), 0)
	s.DrainMs = ms(drain)
	if l := run.res.FetchLatency; l != nil {
		s.FetchP50Ms, s.FetchP99Ms = ms(l.P50), ms(l.P99)
	}
	if l := run.res.Latency; l != nil {
		s.P50Ms, s.P99Ms, s.MaxMs = ms(l.P50), ms(l.P99), ms(l.Max)
	}
	s.KeptUp = drain <= steadyKeptUp
	r.Steady = s
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type steadyProduction struct {
	n       int
	elapsed time.Duration
	last    time.Time // when the last produce call returned
}

// produceSteady produces -rate messages a second for -steady, every 10ms the
// messages due by then, each stamped with its produce time.
func (b *bench) produceSteady(ctx context.Context, topic string, rate int) (steadyProduction, error) {
	w := &kafka.Writer{Addr: kafka.TCP(b.brokers...), Topic: topic, Balancer: accountBalancer,
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	sent := 0
	for done := false; !done; {
		select {
		case <-ctx.Done():
			_ = w.Close()
			return steadyProduction{}, ctx.Err()
		case now := <-tick.C:
			elapsed := now.Sub(start)
			if elapsed >= b.o.steady {
				elapsed, done = b.o.steady, true
			}
			due := int(float64(rate) * elapsed.Seconds())
			if due <= sent {
				continue
			}
			stamp := []byte(strconv.FormatInt(time.Now().UnixNano(), 10))
			msgs := make([]kafka.Message, 0, due-sent)
			for i := sent; i < due; i++ {
				m := backlogMessage("s-", i, b.o.accounts)
				m.Headers = append(m.Headers, kafka.Header{Key: producedAtHeader, Value: stamp})
				msgs = append(msgs, m)
			}
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				_ = w.Close()
				return steadyProduction{}, fmt.Errorf("produce: %w", err)
			}
			sent = due
		}
	}
	last := time.Now()
	if err := w.Close(); err != nil {
		return steadyProduction{}, fmt.Errorf("produce: %w", err)
	}
	return steadyProduction{n: sent, elapsed: last.Sub(start), last: last}, nil
}

// verify checks that the scenario applied every message once: as many claims
// as messages, positions past every message, and balances and update counts
// that add up to what was produced.
func (b *bench) verify(ctx context.Context, schema string, n, sum int64, positions bool) error {
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	var claimed, nextOffsets, balance, updated int64
	err := b.admin.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM `+q("processed_messages")+`),
		(SELECT coalesce(sum(next_offset), 0)::bigint FROM `+q("consumer_positions")+`),
		(SELECT coalesce(sum(balance), 0)::bigint FROM `+q("accounts")+`),
		(SELECT coalesce(sum(updated), 0)::bigint FROM `+q("accounts")+`)`).
		Scan(&claimed, &nextOffsets, &balance, &updated)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if !positions { // the peer's SQL writes no position
		nextOffsets = n
	}
	if claimed != n || nextOffsets != n || balance != sum || updated != n {
		return fmt.Errorf("verify: WRONG RESULT: %d claims, positions sum to %d, %d updates (want %d each); "+
			"balances sum to %d (want %d)", claimed, nextOffsets, updated, n, balance, sum)
	}
	return nil
}

// childRun is a finished child process.
type childRun struct {
	res    childResult
	maxRSS int64 // bytes
	cpu    time.Duration
}

func (c *childRun) result(sc *scenario) *result {
	secs := c.res.Elapsed.Seconds()
	return &result{Scenario: sc.name, Title: sc.title, Messages: c.res.Done, Seconds: secs,
		Rate: float64(c.res.Done) / secs, PeakRSSMiB: float64(c.maxRSS) / (1 << 20),
		ProcessCPU: c.cpu.Seconds(), Txs: c.res.Txs, Duplicates: c.res.Duplicates,
		Segments: c.res.Segments, CPU: c.res.CPU}
}

// runChild runs this binary as the child for spec and waits for its result.
// When the child prints "ready", onReady runs with the child's stdin, which
// is closed afterwards.
func (b *bench) runChild(ctx context.Context, sc *scenario, spec *childSpec,
	onReady func(ctx context.Context, stdin io.Writer) error) (*childRun, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if sc.peer {
		self = b.peerBin
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), childEnv+"="+string(specJSON))
	cmd.Stderr = os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stdin io.WriteCloser
	if onReady != nil {
		if stdin, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child: %w", err)
	}
	var (
		res      *childResult
		readyErr error
	)
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for lines.Scan() {
		line := lines.Text()
		switch {
		case line == "ready" && onReady != nil:
			readyErr = onReady(ctx, stdin)
			_ = stdin.Close()
			if readyErr != nil {
				_ = cmd.Process.Signal(os.Interrupt)
			}
		case strings.HasPrefix(line, "result "):
			res = &childResult{}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "result ")), res); err != nil {
				res, readyErr = nil, fmt.Errorf("child result: %w", err)
			}
		default:
			fmt.Fprintln(os.Stderr, line)
		}
	}
	if stdin != nil {
		_ = stdin.Close()
	}
	waitErr := cmd.Wait()
	switch {
	case readyErr != nil:
		return nil, readyErr
	case waitErr != nil:
		return nil, fmt.Errorf("child: %w", errors.Join(waitErr, context.Cause(ctx)))
	case res == nil:
		return nil, errors.New("child exited without a result")
	}
	run := &childRun{res: *res}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		run.maxRSS = ru.Maxrss << 10 // KiB on Linux
		run.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return run, nil
}
