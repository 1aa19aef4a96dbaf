package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// The horizontal-scaling phase: for each count in -processes, that
// many consumer processes (default settings) join one consumer group over a
// fresh topic of -partitions partitions; once the group is stable, the
// backlog is produced, and the phase measures the time from the first claim
// to the last one (read from PostgreSQL by the parent), the CPU each process
// and its PostgreSQL backends used, and what Kafka and the machine used.
// Counts interleave within a round, rounds repeat -repeat times.

// scaleResult is one process count's figures (its median round).
type scaleResult struct {
	Processes int     `json:"processes"`
	Messages  int64   `json:"messages"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"msgs_per_s"`
	// PerProcess is Rate / Processes.
	PerProcess float64 `json:"msgs_per_s_per_process"`
	// Spread is the largest share of the messages one process handled,
	// times Processes (1 is a perfectly even split).
	Spread     float64 `json:"spread"`
	ClientCPU  float64 `json:"client_cpu_s"` // all processes, their measured intervals
	PGCPU      float64 `json:"pg_backends_cpu_s"`
	KafkaCPU   float64 `json:"kafka_cpu_s"`    // the parent's interval
	MachineCPU float64 `json:"machine_busy_s"` // the parent's interval
	// CPUSeconds is the parent's interval (from the first claim it saw to
	// the last), over which KafkaCPU and MachineCPU are measured.
	CPUSeconds float64 `json:"cpu_interval_s"`
	// ProduceSeconds is how long producing the backlog took (the
	// consumers start on it meanwhile).
	ProduceSeconds float64   `json:"produce_s"`
	PeakRSSMiB     float64   `json:"peak_rss_mib"` // the largest process
	Rounds         []float64 `json:"rounds"`
}

// scaleTimeout bounds the wait for a stable group and for the backlog.
const scaleTimeout = 10 * time.Minute

func (b *bench) runScale(ctx context.Context, sc *scenario, n int) (*scaleResult, error) {
	tag := fmt.Sprintf("%s-%dp-r%d", sc.name, n, b.round)
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

	// Every child runs until the parent has seen the last claim: the parent's
	// onReady blocks until then, and runChild closes the child's stdin.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	drained := make(chan struct{})
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		runs []*childRun
	)
	pool := (b.o.partitions+n-1)/n + 1 // the most partitions one process holds, and one more
	for i := range n {
		spec := b.spec(sc, schema, topic, group, -1)
		spec.Pool = pool
		if spec.CPUProfile != "" { // one file per process
			spec.CPUProfile = filepath.Join(b.o.profileDir, fmt.Sprintf("%s-%dp-%d-r%d.cpu.prof", sc.name, n, i, b.round))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run, err := b.runChild(ctx, sc, spec, func(ctx context.Context, _ io.Writer) error {
				select {
				case <-drained:
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			})
			if err != nil {
				cancel(err)
				return
			}
			mu.Lock()
			runs = append(runs, run)
			mu.Unlock()
		}()
	}
	res, err := b.measureScale(ctx, topic, group, schema, n)
	close(drained)
	wg.Wait()
	if err != nil {
		return nil, errors.Join(err, context.Cause(ctx))
	}
	if cause := context.Cause(ctx); cause != nil {
		return nil, cause
	}
	if err := b.verify(ctx, schema, int64(b.o.messages), sumAmounts(b.o.messages), true); err != nil {
		return nil, err
	}
	var most int64
	for _, r := range runs {
		res.ClientCPU += r.res.CPU.Self
		res.PGCPU += r.res.CPU.Postgres
		res.PeakRSSMiB = max(res.PeakRSSMiB, float64(r.maxRSS)/(1<<20))
		most = max(most, r.res.Done)
	}
	res.Spread = float64(most) * float64(n) / float64(b.o.messages)
	return res, nil
}

// measureScale waits for the group to hold every partition with n members,
// produces the backlog, and times it from the first claim to the last.
func (b *bench) measureScale(ctx context.Context, topic, group, schema string, n int) (*scaleResult, error) {
	wctx, cancel := context.WithTimeout(ctx, scaleTimeout)
	defer cancel()
	if err := b.waitStableGroup(wctx, topic, group, n); err != nil {
		return nil, err
	}
	produceStart := time.Now()
	if err := b.produceBacklog(wctx, topic); err != nil {
		return nil, err
	}
	produced := time.Since(produceStart)
	count := `SELECT count(*) FROM ` + pgx.Identifier{schema, "processed_messages"}.Sanitize()
	var (
		start, end      time.Time
		kafka0, mach0   time.Duration
		kafkaOK, machOK bool
	)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for end.IsZero() {
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("backlog of %d messages not claimed: %w", b.o.messages, context.Cause(wctx))
		case <-tick.C:
		}
		var claimed int64
		if err := b.admin.QueryRow(wctx, count).Scan(&claimed); err != nil {
			return nil, fmt.Errorf("count claims: %w", err)
		}
		now := time.Now()
		if claimed > 0 && start.IsZero() {
			start = now
			kafka0, kafkaOK = processCPU(b.kafkaPID)
			mach0, machOK = machineBusy()
		}
		if claimed >= int64(b.o.messages) {
			end = now
		}
	}
	// The interval comes from the claims themselves (processed_at is the
	// start of each claiming transaction), not from the polls, which a busy
	// machine may delay: from the first claiming transaction to the last.
	var first, last time.Time
	if err := b.admin.QueryRow(wctx, `SELECT min(processed_at), max(processed_at) FROM `+
		pgx.Identifier{schema, "processed_messages"}.Sanitize()).Scan(&first, &last); err != nil {
		return nil, fmt.Errorf("claim times: %w", err)
	}
	r := &scaleResult{Processes: n, Messages: int64(b.o.messages), Seconds: last.Sub(first).Seconds()}
	if r.Seconds <= 0 {
		r.Seconds = end.Sub(start).Seconds()
	}
	r.Rate = float64(r.Messages) / r.Seconds
	r.CPUSeconds, r.ProduceSeconds = end.Sub(start).Seconds(), produced.Seconds()
	r.PerProcess = r.Rate / float64(n)
	if k1, ok := processCPU(b.kafkaPID); ok && kafkaOK {
		r.KafkaCPU = (k1 - kafka0).Seconds()
	}
	if m1, ok := machineBusy(); ok && machOK {
		r.MachineCPU = (m1 - mach0).Seconds()
	}
	return r, nil
}

// waitStableGroup waits until group is Stable with n members that were
// assigned every partition of topic.
func (b *bench) waitStableGroup(ctx context.Context, topic, group string, n int) error {
	var last string
	for {
		resp, err := b.client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err == nil && len(resp.Groups) == 1 {
			g := resp.Groups[0]
			assigned := 0
			for _, m := range g.Members {
				for _, t := range m.MemberAssignments.Topics {
					if t.Topic == topic {
						assigned += len(t.Partitions)
					}
				}
			}
			last = fmt.Sprintf("state %s, %d members, %d partitions assigned", g.GroupState, len(g.Members), assigned)
			if g.Error == nil && g.GroupState == "Stable" && len(g.Members) == n && assigned == b.o.partitions {
				return nil
			}
		} else if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("group %s of %d processes never became stable (%s): %w", group, n, last, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// produceBacklog produces -messages messages to topic, as prepareBacklog.
func (b *bench) produceBacklog(ctx context.Context, topic string) error {
	w := &kafka.Writer{Addr: kafka.TCP(b.brokers...), Topic: topic, Balancer: accountBalancer,
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: 2 * time.Millisecond}
	const chunk = 10_000
	for from := 0; from < b.o.messages; from += chunk {
		msgs := make([]kafka.Message, 0, chunk)
		for i := from; i < min(from+chunk, b.o.messages); i++ {
			msgs = append(msgs, backlogMessage("m-", i, b.o.accounts))
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			_ = w.Close()
			return fmt.Errorf("produce backlog: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("produce backlog: %w", err)
	}
	return nil
}

// medianScale returns the round with the median rate, with every round's rate.
func medianScale(rs []*scaleResult) *scaleResult {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b *scaleResult) int { return cmp.Compare(a.Rate, b.Rate) })
	m := *sorted[len(sorted)/2]
	m.Rounds = nil
	for _, r := range rs {
		m.Rounds = append(m.Rounds, r.Rate)
	}
	return &m
}

// printScale writes the scaling table.
func (r *report) printScale(p func(format string, args ...any)) {
	if len(r.scale) == 0 {
		return
	}
	p("\nHorizontal scaling: N consumer processes (default settings) in one group over %d partitions, "+
		"%d messages produced once the group is stable; measured from the first claiming transaction to the last "+
		"(their processed_at); CPU from the first claim seen to the last (polled every 20 ms); each process's pool holds ceil(partitions/N)+1 connections.\n\n",
		r.o.partitions, r.o.messages)
	var produce []string
	for _, s := range r.scale {
		produce = append(produce, fmt.Sprintf("%.2f s", s.ProduceSeconds))
	}
	p("Producing the backlog took %s (N = %v, median rounds): the consumers start on it meanwhile.\n\n",
		strings.Join(produce, ", "), r.o.processes)
	p("| processes | msgs/s (median) | rounds | × 1 process | msgs/s per process | busiest process's share × N | client CPU-s / 100k | PG backends CPU-s / 100k | Kafka CPU-s / 100k | machine busy (cores) | peak RSS MiB (largest process) |\n")
	p("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	base := r.scale[0].Rate
	for _, s := range r.scale {
		per100k := func(v float64) float64 { return v * 100_000 / float64(s.Messages) }
		rounds := ""
		for i, x := range s.Rounds {
			if i > 0 {
				rounds += " / "
			}
			rounds += fmt.Sprintf("%.0f", x)
		}
		p("| %d | %.0f | %s | %.2f× | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f |\n",
			s.Processes, s.Rate, rounds, s.Rate/base, s.PerProcess, s.Spread, per100k(s.ClientCPU),
			per100k(s.PGCPU), per100k(s.KafkaCPU), s.MachineCPU/s.CPUSeconds, s.PeakRSSMiB)
	}
}
