package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// harness holds the servers and what the comparison created, to remove it
// at the end.
type harness struct {
	o       *options
	dbURL   string
	brokers []string
	admin   *pgxpool.Pool
	client  *kafka.Client
	runID   string
	self    string // this binary, run as the instances
	logDir  string

	schemas []string
	topics  []string
	groups  []string
}

func runComparison(ctx context.Context, o *options) (err error) {
	dbURL := strings.TrimSpace(os.Getenv(envDatabaseURL))
	var brokers []string
	for _, b := range strings.Split(os.Getenv(envKafkaBrokers), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if dbURL == "" || len(brokers) == 0 {
		return fmt.Errorf("set %s and %s (source .dev/env after starting the development servers)",
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
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	h := &harness{o: o, dbURL: dbURL, brokers: brokers, admin: admin, self: self,
		client: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second},
		runID:  hex.EncodeToString(id[:]), logDir: o.logDir}
	if h.logDir == "" {
		if h.logDir, err = os.MkdirTemp("", "idemkit-churn-"); err != nil {
			return err
		}
		defer os.RemoveAll(h.logDir)
	} else if err := os.MkdirAll(h.logDir, 0o755); err != nil {
		return err
	}
	defer h.cleanup(ctx)

	var results []*runResult
	defer func() {
		// Report what was measured, also when a later run failed.
		rep := &report{o: o, runs: results}
		rep.print(os.Stdout)
		if o.jsonPath != "" {
			if jerr := rep.writeJSON(o.jsonPath); jerr != nil && err == nil {
				err = jerr
			}
		}
	}()
	total := o.rounds * len(o.killEvery) * len(o.configs)
	n := 0
	for round := 1; round <= o.rounds; round++ {
		configs := slices.Clone(o.configs)
		if round%2 == 0 {
			slices.Reverse(configs) // no configuration always runs first
		}
		for _, every := range o.killEvery {
			for _, c := range configs {
				n++
				progress("run %d of %d: round %d, config %s (%s), kill every %s", n, total, round, c.Name, c, every)
				res, err := h.run(ctx, c, every, round)
				if res != nil {
					results = append(results, res)
					progress("  %s", res.summary())
				}
				if err != nil {
					return fmt.Errorf("round %d, config %s, kill every %s: %w", round, c.Name, every, err)
				}
			}
		}
	}
	return nil
}

// name returns a name unique to this comparison, usable as a schema, topic
// or group.
func (h *harness) name(sep, suffix string) string {
	return "idemkit" + sep + "churn" + sep + h.runID + sep + strings.ReplaceAll(suffix, "-", sep)
}

func (h *harness) newSchema(ctx context.Context, suffix string) (string, error) {
	schema := h.name("_", suffix)
	if _, err := h.admin.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", fmt.Errorf("create schema: %w", err)
	}
	h.schemas = append(h.schemas, schema)
	m, err := migrate.New(h.admin, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return "", err
	}
	if _, err := m.Up(ctx); err != nil {
		return "", err
	}
	if _, err := h.admin.Exec(ctx, fmt.Sprintf(effectsDDL, pgx.Identifier{schema, "effects"}.Sanitize())); err != nil {
		return "", fmt.Errorf("create effects: %w", err)
	}
	return schema, nil
}

func (h *harness) newTopic(ctx context.Context, suffix string) (string, error) {
	topic := h.name("-", suffix)
	resp, err := h.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: h.o.partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return "", fmt.Errorf("create topic %s: %w", topic, err)
	}
	h.topics = append(h.topics, topic)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return topic, testenv.WaitTopic(wctx, h.client, topic, h.o.partitions)
}

// cleanup drops the schemas, deletes the consumer groups and topics the
// comparison created, also after an error or an interrupt.
func (h *harness) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, s := range h.schemas {
		if _, err := h.admin.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{s}.Sanitize()+` CASCADE`); err != nil {
			progress("cleanup: drop schema %s: %v", s, err)
		}
	}
	if len(h.groups) > 0 {
		resp, err := h.client.DeleteGroups(ctx, &kafka.DeleteGroupsRequest{GroupIDs: h.groups})
		if err == nil {
			var errs []error
			for _, e := range resp.Errors {
				errs = append(errs, e)
			}
			err = errors.Join(errs...)
		}
		if err != nil {
			progress("cleanup: delete consumer groups: %v", err)
		}
	}
	if len(h.topics) > 0 {
		resp, err := h.client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: h.topics})
		if err == nil {
			var errs []error
			for _, e := range resp.Errors {
				errs = append(errs, e)
			}
			err = errors.Join(errs...)
		}
		if err != nil {
			progress("cleanup: delete topics: %v", err)
		}
	}
}

// assignment is a partition started by an instance (an AssignEvent).
type assignment struct {
	Instance  string    `json:"instance"`
	Partition int       `json:"partition"`
	At        time.Time `json:"at"`
}

// groupState is the group's state as DescribeGroups saw it, recorded when it
// changed.
type groupState struct {
	At      time.Time `json:"at"`
	State   string    `json:"state"`
	Members int       `json:"members"`
}

// kill is one instance stopped and started again.
type kill struct {
	Slot      int       `json:"slot"`
	At        time.Time `json:"at"`        // the signal
	Exited    time.Time `json:"exited"`    // the process was reaped
	Restarted time.Time `json:"restarted"` // its replacement started
}

// instance is one consumer process.
type instance struct {
	name     string
	cmd      *exec.Cmd
	exited   chan struct{}
	stopping atomic.Bool // we signalled it: its exit is expected
}

// churnRun is one configuration under one kill interval in one round.
type churnRun struct {
	h      *harness
	cfg    groupConfig
	every  time.Duration
	round  int
	schema string
	topic  string
	group  string
	log    *os.File

	mu      sync.Mutex
	assigns []assignment
	states  []groupState
	dups    int
	failed  error // an instance exited on its own, or the producer failed

	produced atomic.Int64
	slots    []*instance
	starts   []int // incarnations per slot
	wg       sync.WaitGroup
}

func (r *churnRun) fail(err error) {
	r.mu.Lock()
	if r.failed == nil {
		r.failed = err
	}
	r.mu.Unlock()
}

func (r *churnRun) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// run measures one configuration under one kill interval.
func (h *harness) run(ctx context.Context, cfg groupConfig, every time.Duration, round int) (*runResult, error) {
	tag := fmt.Sprintf("%s-%s-r%d", strings.ToLower(cfg.Name), strings.ReplaceAll(every.String(), ".", "p"), round)
	r := &churnRun{h: h, cfg: cfg, every: every, round: round}
	var err error
	if r.schema, err = h.newSchema(ctx, tag); err != nil {
		return nil, err
	}
	if r.topic, err = h.newTopic(ctx, tag); err != nil {
		return nil, err
	}
	r.group = h.name("-", tag)
	h.groups = append(h.groups, r.group)
	if r.log, err = os.OpenFile(filepath.Join(h.logDir, tag+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o644); err != nil {
		return nil, err
	}
	defer r.log.Close()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopWatch := r.watch(runCtx)
	defer stopWatch()
	stopProduce := r.produce(runCtx)
	defer stopProduce()
	r.slots = make([]*instance, h.o.instances)
	r.starts = make([]int, h.o.instances)
	defer r.stopAll()
	for i := range r.slots {
		if err := r.start(i); err != nil {
			return nil, err
		}
	}

	// Warm up: the group is stable with every instance, and every partition
	// applied a message since it was last assigned.
	if err := r.waitUntil(ctx, h.o.warmup, "the group to settle", func(ctx context.Context) (bool, error) {
		return r.settled(ctx, time.Time{})
	}); err != nil {
		return nil, err
	}
	time.Sleep(time.Second)

	// Churn: kill one instance every interval, start it again at once.
	var kills []kill
	first := time.Now()
	for i := 0; ; i++ {
		at := first.Add(time.Duration(i) * every)
		if at.Sub(first) >= h.o.churn {
			break
		}
		if err := sleepUntil(ctx, at); err != nil {
			return nil, err
		}
		if err := r.err(); err != nil {
			return nil, err
		}
		k, err := r.kill(ctx, i%len(r.slots))
		if err != nil {
			return nil, err
		}
		kills = append(kills, k)
	}
	churnEnd := first.Add(h.o.churn)
	if err := sleepUntil(ctx, churnEnd); err != nil {
		return nil, err
	}

	// Settle: every partition assigned and applying since the last kill.
	last := kills[len(kills)-1].At
	settleErr := r.waitUntil(ctx, h.o.settle, "every partition to resume", func(ctx context.Context) (bool, error) {
		return r.settled(ctx, last)
	})
	if settleErr != nil && r.err() != nil {
		return nil, settleErr
	}
	end := time.Now()
	produced := stopProduce()
	if err := r.err(); err != nil {
		return nil, err
	}

	// Drain: every produced message applied.
	drained := r.waitUntil(ctx, time.Minute, "every message to be applied", func(ctx context.Context) (bool, error) {
		var n int64
		err := h.admin.QueryRow(ctx, `SELECT count(*) FROM `+r.table()).Scan(&n)
		return n >= produced, err
	}) == nil
	r.stopAll()
	stopWatch()

	res, err := r.analyze(ctx, kills, first, churnEnd, end, produced)
	if err != nil {
		return nil, err
	}
	res.Settled = settleErr == nil
	res.Drained = drained
	if err := res.verify(); err != nil {
		return res, err
	}
	return res, nil
}

func (r *churnRun) table() string { return pgx.Identifier{r.schema, "effects"}.Sanitize() }

// settled reports whether the group is stable with every instance and every
// partition was assigned after since and applied a message after its last
// assignment.
func (r *churnRun) settled(ctx context.Context, since time.Time) (bool, error) {
	r.mu.Lock()
	var stable bool
	if n := len(r.states); n > 0 {
		s := r.states[n-1]
		stable = s.State == "Stable" && s.Members == len(r.slots)
	}
	lastAssigned := make(map[int]time.Time)
	for _, a := range r.assigns {
		if a.At.After(since) && a.At.After(lastAssigned[a.Partition]) {
			lastAssigned[a.Partition] = a.At
		}
	}
	r.mu.Unlock()
	if !stable || len(lastAssigned) < r.h.o.partitions {
		return false, nil
	}
	rows, err := r.h.admin.Query(ctx, `SELECT part, max(applied_at) FROM `+r.table()+` GROUP BY part`)
	if err != nil {
		return false, err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Part int
		At   time.Time
	}])
	if err != nil {
		return false, err
	}
	ok := 0
	for _, a := range applied {
		if at, found := lastAssigned[a.Part]; found && !a.At.Before(at) {
			ok++
		}
	}
	return ok == r.h.o.partitions, nil
}

// waitUntil polls cond every 100ms until it holds, the run fails or max
// passes.
func (r *churnRun) waitUntil(ctx context.Context, max time.Duration, what string, cond func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(max)
	for {
		if err := r.err(); err != nil {
			return err
		}
		ok, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not happen within %s", what, max)
		}
		if err := sleepUntil(ctx, time.Now().Add(100*time.Millisecond)); err != nil {
			return err
		}
	}
}

func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// watch polls the group's state every 100ms, recording changes, until the
// returned function is called.
func (r *churnRun) watch(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			resp, err := r.h.client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{r.group}})
			if err == nil && len(resp.Groups) == 1 && resp.Groups[0].Error == nil {
				g := resp.Groups[0]
				s := groupState{At: time.Now(), State: g.GroupState, Members: len(g.Members)}
				r.mu.Lock()
				if n := len(r.states); n == 0 || r.states[n-1].State != s.State || r.states[n-1].Members != s.Members {
					r.states = append(r.states, s)
				}
				r.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

// produce writes -rate messages a second (IDs m-0, m-1, …, spread round
// robin over the partitions) until the returned function is called, which
// returns how many were written. A failed write fails the run.
func (r *churnRun) produce(ctx context.Context) (stop func() int64) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		w := &kafka.Writer{Addr: kafka.TCP(r.h.brokers...), Topic: r.topic, Balancer: &kafka.RoundRobin{},
			RequiredAcks: kafka.RequireAll, BatchSize: 100, BatchTimeout: time.Millisecond}
		defer w.Close()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		sent := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-quit: // never during a write: the count stays exact
				return
			case now := <-tick.C:
				due := int(float64(r.h.o.rate) * now.Sub(start).Seconds())
				if due <= sent {
					continue
				}
				msgs := make([]kafka.Message, 0, due-sent)
				for i := sent; i < due; i++ {
					msgs = append(msgs, kafka.Message{Value: []byte(strconv.Itoa(i)),
						Headers: []kafka.Header{{Key: "message-id", Value: []byte("m-" + strconv.Itoa(i))}}})
				}
				if err := w.WriteMessages(ctx, msgs...); err != nil {
					if ctx.Err() == nil {
						r.fail(fmt.Errorf("produce: %w", err))
					}
					return
				}
				sent = due
				r.produced.Store(int64(sent))
			}
		}
	}()
	var once sync.Once
	return func() int64 { once.Do(func() { close(quit); <-done }); return r.produced.Load() }
}

// start runs a new instance in slot i.
func (r *churnRun) start(i int) error {
	r.starts[i]++
	name := fmt.Sprintf("i%d.%d", i, r.starts[i])
	spec, err := json.Marshal(&childSpec{Name: name, DatabaseURL: r.h.dbURL, Brokers: r.h.brokers,
		Schema: r.schema, Topic: r.topic, Group: r.group, Batch: r.h.o.batch,
		Session: r.cfg.Session, Heartbeat: r.cfg.Heartbeat, Rebalance: r.cfg.Rebalance, StopDelay: r.h.o.stopDelay})
	if err != nil {
		return err
	}
	cmd := exec.Command(r.h.self)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stderr = r.log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start instance: %w", err)
	}
	inst := &instance{name: name, cmd: cmd, exited: make(chan struct{})}
	r.slots[i] = inst
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(inst.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.line(inst.name, sc.Text())
		}
		err := cmd.Wait()
		if !inst.stopping.Load() {
			r.fail(fmt.Errorf("instance %s exited on its own (%v); see its log in %s", inst.name, err, r.log.Name()))
		}
	}()
	return nil
}

// line records one line an instance printed.
func (r *churnRun) line(name, line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if line == "duplicate" {
		r.dups++
		return
	}
	f := strings.Fields(line)
	if len(f) == 3 && f[0] == "assigned" {
		p, err1 := strconv.Atoi(f[1])
		ns, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 == nil && err2 == nil {
			r.assigns = append(r.assigns, assignment{Instance: name, Partition: p, At: time.Unix(0, ns)})
		}
	}
}

// kill stops the instance in slot i (SIGKILL, or SIGTERM for a graceful
// configuration), waits until it is gone and starts its replacement, after
// -restart-delay.
func (r *churnRun) kill(ctx context.Context, i int) (kill, error) {
	inst := r.slots[i]
	sig := syscall.SIGKILL
	if r.cfg.Graceful {
		sig = syscall.SIGTERM
	}
	inst.stopping.Store(true)
	k := kill{Slot: i, At: time.Now()}
	if err := inst.cmd.Process.Signal(sig); err != nil {
		return k, fmt.Errorf("signal %s: %w", inst.name, err)
	}
	select {
	case <-inst.exited:
	case <-time.After(time.Minute):
		_ = inst.cmd.Process.Kill()
		<-inst.exited
	case <-ctx.Done():
		return k, ctx.Err()
	}
	k.Exited = time.Now()
	if err := sleepUntil(ctx, k.Exited.Add(r.h.o.restart)); err != nil {
		return k, err
	}
	if err := r.start(i); err != nil {
		return k, err
	}
	k.Restarted = time.Now()
	return k, nil
}

// stopAll stops every instance with SIGTERM (SIGKILL after 30s) and waits
// for their goroutines.
func (r *churnRun) stopAll() {
	for _, inst := range r.slots {
		if inst != nil && inst.stopping.CompareAndSwap(false, true) {
			_ = inst.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, inst := range r.slots {
		if inst == nil {
			continue
		}
		select {
		case <-inst.exited:
		case <-time.After(30 * time.Second):
			_ = inst.cmd.Process.Kill()
			<-inst.exited
		}
	}
	r.wg.Wait()
}
