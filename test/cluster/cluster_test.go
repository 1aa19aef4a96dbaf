package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/kafkaproc"
)

// EnvCluster, set to 1, runs the long variants (TestBrokerStoppedLong).
const EnvCluster = "IDEMKIT_CLUSTER"

const (
	// BrokerStopLong is how long TestBrokerStoppedLong keeps a node down.
	BrokerStopLong = time.Minute
	// BrokerStopShort is the CI-sized variant's.
	BrokerStopShort = 15 * time.Second
)

// TestCluster starts one cluster (25 to 75 s on two busy cores) for its
// subtests, which run in turn, each on topics, a schema and a group of its
// own, each starting first any node a failed subtest left stopped:
//
//   - LeaderKilled: the leader of the busiest partition is SIGKILLed while 3
//     runners and 2 relays run and a producer writes with acks=all; the node
//     is started again once the others carried on without it.
//   - RelayBelowMinISR: see belowMinISR.
//   - BrokerStopped: the group coordinator's node is stopped (SIGTERM) for
//     BrokerStopShort while everything runs, then started again.
//   - LeaderKilledLong, BrokerStoppedLong (IDEMKIT_CLUSTER=1 only): four
//     times the messages, and the node down for BrokerStopLong, a minute.
func TestCluster(t *testing.T) {
	c := kafkaproc.StartCluster(t)
	t.Logf("cluster up: %v", c.Addrs())
	sub := func(name string, ci bool, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			if !ci && os.Getenv(EnvCluster) != "1" {
				t.Skip("opt-in (the module's CI run has only LeaderKilled): " + EnvCluster + "=1 scripts/test-cluster (or " + EnvCluster +
					"=1 go test -race -count=1 -timeout 40m -run 'TestCluster/" + name + "' ./cluster/ in the test module)")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := c.StartStopped(ctx); err != nil {
				t.Fatal(err)
			}
			f(t)
		})
	}
	sub("LeaderKilled", true, func(t *testing.T) {
		run(t, c, scenario{outboxMsgs: 1500, producerMsgs: 1500, keys: 50, produceFor: 20 * time.Second,
			fault: leaderKill, budget: 4 * time.Minute})
	})
	sub("RelayBelowMinISR", false, func(t *testing.T) { belowMinISR(t, c) })
	sub("BrokerStopped", false, func(t *testing.T) {
		run(t, c, scenario{outboxMsgs: 1500, producerMsgs: 1500, keys: 50, produceFor: 2 * BrokerStopShort,
			fault: brokerStop, stopFor: BrokerStopShort, budget: 4 * time.Minute})
	})
	sub("LeaderKilledLong", false, func(t *testing.T) {
		run(t, c, scenario{outboxMsgs: 6000, producerMsgs: 6000, keys: 200, produceFor: 60 * time.Second,
			fault: leaderKill, budget: 6 * time.Minute})
	})
	sub("BrokerStoppedLong", false, func(t *testing.T) {
		run(t, c, scenario{outboxMsgs: 6000, producerMsgs: 6000, keys: 200, produceFor: 2 * BrokerStopLong,
			fault: brokerStop, stopFor: BrokerStopLong, budget: 8 * time.Minute})
	})
}

// commitLeaveMsg is what a runner logs when it leaves its generation
// because an offset commit failed.
const commitLeaveMsg = "kafka offset commit failed; leaving the generation (positions are safe in PostgreSQL)"

type faultKind int

const (
	// leaderKill kills the leader of the partition with the most messages
	// (SIGKILL) and starts it again once the others carried on.
	leaderKill faultKind = iota + 1
	// brokerStop stops the node that coordinates the consumer group
	// (SIGTERM) for stopFor, then starts it again.
	brokerStop
)

// scenario is one run: messages written by the outbox (published by the
// relays) and by the producer, spread over produceFor, and one fault once
// 30% of them were written.
type scenario struct {
	outboxMsgs, producerMsgs int
	keys                     int // per source
	produceFor               time.Duration
	fault                    faultKind
	stopFor                  time.Duration
	budget                   time.Duration
}

const partitions = 6

var (
	runners = []string{"runner-1", "runner-2", "runner-3"}
	relays  = []string{"relay-1", "relay-2"}
)

// exit is a part returning from Run.
type exit struct {
	name string
	err  error
}

func run(t *testing.T, c *kafkaproc.Cluster, sc scenario) {
	began := time.Now()
	deadline := began.Add(sc.budget)
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(time.Minute))
	defer cancel()
	since := func() time.Duration { return time.Since(began).Round(time.Millisecond) }

	brokers := c.Addrs()
	a := newApp(t, sc.keys)
	topic := testenv.Name(t, "in")
	group := testenv.Name(t, "g")
	if err := c.CreateTopic(ctx, topic, partitions, 3); err != nil {
		t.Fatal(err)
	}
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: a.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: a.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.DatabaseURL(t)
	loggers := map[string]*slog.Logger{}
	logs := map[string]*testenv.Logs{}
	for _, name := range append(slices.Clone(runners), relays...) {
		rec, l := testenv.NewLogs(t)
		logs[name], loggers[name] = rec, l.With("part", name)
	}
	// leftOnCommit counts the runners' logs of a generation left because an
	// offset commit failed with an error of a coordinator that could not
	// write it for now (a commit refused because the generation is over is
	// no reason to count).
	leftOnCommit := func() (n int) {
		busy := func(rec map[string]any) bool {
			e, _ := rec["err"].(string)
			for _, code := range []kafka.Error{kafka.GroupCoordinatorNotAvailable, kafka.GroupLoadInProgress, kafka.RequestTimedOut,
				kafka.NotEnoughReplicas, kafka.NotEnoughReplicasAfterAppend} {
				if strings.HasPrefix(e, fmt.Sprintf("[%d] ", int(code))) {
					return true
				}
			}
			return false
		}
		for _, name := range runners {
			n += logs[name].CountFunc(commitLeaveMsg, busy)
		}
		return n
	}

	// The parts under test: only the test cancels them. At cleanup (also
	// after a failure) they are cancelled and waited for before the
	// cluster goes away.
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	exits := make(chan exit, len(runners)+len(relays))
	defer func() {
		stop()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Errorf("parts still running a minute after they were cancelled")
		}
	}()
	kc := kafkaconn.Config{Brokers: brokers}
	// The runners' generations and failed offset commits.
	var rebalances, commitFailures atomic.Int64
	hooks := &testobs.Hooks{
		OnRebalanced:         func(int32, []int) { rebalances.Add(1) },
		OnOffsetCommitFailed: func(string, map[int]int64, error) { commitFailures.Add(1) },
	}
	for i, name := range runners {
		pool := testenv.PartPool(t, ctx, url, name, 4)
		cfg := &consumer.Config{Kafka: kc, Topic: topic, GroupID: group, Store: claims,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, Logger: loggers[name], Observers: []consumer.Observer{hooks}}
		switch i {
		case 0: // one transaction per message
			cfg.BatchSize, cfg.Handler = 1, a.handler(name)
		case 1: // up to 100 messages per transaction, one handler call each
			cfg.BatchSize, cfg.Handler = 100, a.handler(name)
		default: // up to 100 messages per transaction, one handler call for all
			cfg.BatchSize, cfg.BatchHandler = 100, a.batchHandler(name)
		}
		r, err := consumer.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { exits <- exit{name: name, err: r.Run(runCtx)} })
	}
	// delivered holds every ID a relay reported delivered (AfterPublish:
	// acknowledged by Kafka, before the mark commits).
	var (
		deliveredMu sync.Mutex
		delivered   = map[string]bool{}
		nDelivered  atomic.Int64
	)
	for _, name := range relays {
		rl, err := outbox.NewRelay(testenv.PartPool(t, ctx, url, name, 4), store, &outbox.RelayConfig{Kafka: kc,
			PollInterval: 100 * time.Millisecond, PublishTimeout: 5 * time.Second,
			Logger: loggers[name], Observers: []outbox.Observer{&testobs.Outbox{OnAfterPublish: func(_ context.Context, recs []outbox.Record) {
				deliveredMu.Lock()
				for _, r := range recs {
					delivered[r.ID] = true
				}
				deliveredMu.Unlock()
				nDelivered.Add(int64(len(recs)))
			}}}, Retry: retry.Policy{MaxInterval: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { exits <- exit{name: name, err: rl.Run(runCtx)} })
	}
	deliveredIDs := func() []string {
		deliveredMu.Lock()
		defer deliveredMu.Unlock()
		var out []string
		for id := range delivered {
			out = append(out, id)
		}
		return out
	}

	var src sources
	srcDone := make(chan error, 2)
	enqPool := testenv.PartPool(t, ctx, url, "enqueuer", 4)
	wg.Go(func() {
		srcDone <- src.enqueue(runCtx, enqPool, store, topic, sc.outboxMsgs, sc.keys, sc.produceFor)
	})
	wg.Go(func() { srcDone <- src.produce(runCtx, brokers, topic, sc.producerMsgs, sc.keys, sc.produceFor) })
	total := int64(sc.outboxMsgs + sc.producerMsgs)
	written := func() int64 { return src.enqueued.Load() + src.sent.Load() }
	t.Logf("%s: parts started; writing %d messages over %s", since(), total, sc.produceFor)

	status := func() string {
		n, err := a.count(ctx)
		return fmt.Sprintf("%d of %d written (%d outbox, %d produced), %d relay deliveries, %d effects (%v)",
			written(), total, src.enqueued.Load(), src.sent.Load(), nDelivered.Load(), n, err)
	}
	check := func() {
		t.Helper()
		select {
		case e := <-exits:
			t.Fatalf("%s returned from Run before the test cancelled it: %v (its log records above have part=%s)", e.name, e.err, e.name)
		default:
		}
	}
	wait := func(what string, within time.Duration, cond func() (bool, error)) {
		t.Helper()
		end := time.Now().Add(within)
		if deadline.Before(end) {
			end = deadline
		}
		start := time.Now()
		for {
			check()
			ok, err := cond()
			if ok {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%s: not within %s (last error: %v); %s", what, time.Since(start).Round(time.Second), err, status())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	effects := func() int64 { n, _ := a.count(ctx); return n }

	// The fault, once 30% of the messages are written.
	wait("30% of the messages written", 2*time.Minute, func() (bool, error) { return written() >= total*3/10, nil })
	var victim int
	switch sc.fault {
	case leaderKill:
		// The busiest partition led by a node that does not coordinate the
		// group: the runners' generation survives the kill, and their
		// fetchers must follow the partition to its new leader (the
		// coordinator's loss is BrokerStopped's).
		coord, err := coordinator(ctx, brokers, group)
		if err != nil {
			t.Fatal(err)
		}
		p, end, err := busiest(ctx, brokers, topic, func(p int) bool {
			l, err := c.Leader(ctx, topic, p)
			return err == nil && l != coord
		})
		if err != nil {
			t.Fatal(err)
		}
		victim, err = c.Leader(ctx, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		// The runners must have messages to commit offsets for while the
		// node is in the ISRs: the producer's and the relays' writes
		// (acks=all) wait for the dead node too, so runners that caught up
		// before the kill would commit nothing until it left the ISRs
		// (about 8 s, when the controller fences it), and no commit would
		// meet the coordinator unable to write (the test failed so, 1 run
		// in 4). Their handlers are held until a backlog built up, and let
		// go right after the kill.
		resume := a.pause()
		defer resume()
		applied := effects()
		wait("a backlog of 100 messages while the handlers are held", time.Minute, func() (bool, error) {
			return written()-applied >= 100, nil
		})
		t0 := time.Now()
		e0, d0 := effects(), nDelivered.Load()
		r0, f0, l0 := rebalances.Load(), commitFailures.Load(), leftOnCommit()
		if err := c.Node(victim).Stop(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		resume()
		t.Logf("%s: SIGKILLed node %d, leader of %s/%d (the busiest not led by the coordinator, node %d: %d messages); %s",
			since(), victim, topic, p, coord, end, status())
		var newLeader int
		wait("another leader of the busy partition", time.Minute, func() (bool, error) {
			l, err := c.Leader(ctx, topic, p)
			newLeader = l
			return err == nil && l != victim, err
		})
		t.Logf("%s: node %d leads %s/%d, %s after the kill", since(), newLeader, topic, p, time.Since(t0).Round(time.Millisecond))
		e1, d1 := effects(), nDelivered.Load()
		wait("the runners and relays carrying on without the node", 2*time.Minute, func() (bool, error) {
			return effects() >= e1+200 && nDelivered.Load() >= d1+100, nil
		})
		t.Logf("%s: carried on: %d effects and %d relay deliveries since the kill; %s", since(), effects()-e0, nDelivered.Load()-d0, status())
		checkDelivered(t, c.Others(victim), topic, deliveredIDs(), fmt.Sprintf("while node %d is down", victim))
		// Until the dead node leaves the ISR of __consumer_offsets, the
		// coordinator (alive) cannot write offset commits and answers
		// COORDINATOR_NOT_AVAILABLE: the runners must not leave their
		// generation for that (a rebalance of the whole group for a node
		// that does not coordinate it).
		r, f, l := rebalances.Load()-r0, commitFailures.Load()-f0, leftOnCommit()-l0
		if f == 0 || l != 0 {
			t.Errorf("after node %d (not the group's coordinator, node %d) was killed: %d offset commits failed, %d times a runner "+
				"left its generation for it (%q); want failed commits (the coordinator could not write them) and no runner leaving",
				victim, coord, f, l, commitLeaveMsg)
		} else {
			t.Logf("%d offset commits failed while node %d was in the ISRs; no runner left its generation for it "+
				"(Rebalanced ran %d times meanwhile: kafka-go ends a generation at its first failed heartbeat)", f, victim, r)
		}
	case brokerStop:
		coord, err := coordinator(ctx, brokers, group)
		if err != nil {
			t.Fatal(err)
		}
		victim = coord
		e0, d0 := effects(), nDelivered.Load()
		if err := c.Node(victim).Stop(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		t.Logf("%s: stopped node %d (SIGTERM), the group's coordinator, for %s; %s", since(), victim, sc.stopFor, status())
		for time.Since(stopped) < sc.stopFor {
			check()
			time.Sleep(min(200*time.Millisecond, sc.stopFor-time.Since(stopped)))
		}
		e1, d1 := effects(), nDelivered.Load()
		t.Logf("%s: node %d down for %s: %d effects and %d relay deliveries meanwhile; %s", since(), victim,
			time.Since(stopped).Round(time.Millisecond), e1-e0, d1-d0, status())
		if e1-e0 < 200 || d1-d0 < 100 {
			t.Errorf("while node %d was down: %d effects and %d relay deliveries, want at least 200 and 100 (consumption must go on)",
				victim, e1-e0, d1-d0)
		}
		if c2, err := coordinator(ctx, c.Others(victim), group); err != nil || c2 == victim {
			t.Errorf("while node %d was down, the group's coordinator is %d (%v)", victim, c2, err)
		} else {
			t.Logf("the group's coordinator moved to node %d", c2)
		}
		checkDelivered(t, c.Others(victim), topic, deliveredIDs(), fmt.Sprintf("while node %d is down", victim))
	}
	t0 := time.Now()
	if err := c.Node(victim).Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitISR(ctx, topic); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: node %d started again, back in every ISR of %s after %s", since(), victim, topic, time.Since(t0).Round(time.Millisecond))

	// Everything written, applied and published.
	for range 2 {
		var err error
		wait("the sources writing every message", 3*time.Minute, func() (bool, error) {
			select {
			case err = <-srcDone:
				return true, nil
			default:
				return false, nil
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: every message written", since())
	want := src.want(sc.producerMsgs)
	wait("every message applied", 2*time.Minute, func() (bool, error) {
		n, err := a.count(ctx)
		return n >= int64(len(want)), err
	})
	t.Logf("%s: every message applied", since())
	wait("the outbox drained", time.Minute, func() (bool, error) {
		st, err := store.Stats(ctx, a.db.Pool)
		if err == nil && st.Dead > 0 {
			t.Fatalf("%d outbox messages dead", st.Dead)
		}
		return err == nil && st.Backlog == 0, err
	})

	check()
	stop()
	for range len(runners) + len(relays) {
		select {
		case e := <-exits:
			if e.err != nil {
				t.Errorf("%s: Run returned %v after the cancellation, want nil", e.name, e.err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("parts still running a minute after they were cancelled")
		}
	}

	a.checkEffects(t, ctx, group, want)
	ids := checkDelivered(t, brokers, topic, deliveredIDs(), "at the end")
	if lost := missing(want, ids); len(lost) > 0 {
		t.Errorf("%d of %d messages in the topic; missing (first 20): %v", len(ids), len(want), lost)
	}
	if !t.Failed() {
		t.Logf("%d messages (%d through the outbox, %d produced) applied once each, in order per key; test took %s",
			len(want), sc.outboxMsgs, sc.producerMsgs, since())
	}
}

// checkDelivered reads topic from brokers and fails the test unless every
// ID a relay reported delivered is there. It returns the IDs in the topic.
func checkDelivered(t *testing.T, brokers []string, topic string, delivered []string, when string) map[string]bool {
	t.Helper()
	ids, n := inTopic(t, brokers, topic)
	if lost := missing(delivered, ids); len(lost) > 0 {
		t.Errorf("%s: messages the relays reported delivered are not in %s (read from %v; first 20): %v", when, topic, brokers, lost)
	} else {
		t.Logf("%s: the %d messages the relays reported delivered are all in %s (%d messages read from %v)",
			when, len(delivered), topic, n, brokers)
	}
	return ids
}

// busiest returns the partition of topic with the highest end offset among
// those ok accepts.
func busiest(ctx context.Context, brokers []string, topic string, ok func(int) bool) (partition int, end int64, err error) {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
	var reqs []kafka.OffsetRequest
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, 0, err
	}
	end = -1
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return 0, 0, po.Error
		}
		if po.LastOffset > end && ok(po.Partition) {
			partition, end = po.Partition, po.LastOffset
		}
	}
	if end < 0 {
		return 0, 0, fmt.Errorf("no partition of %s fits", topic)
	}
	return partition, end, nil
}

// coordinator returns the node.id of group's coordinator.
func coordinator(ctx context.Context, brokers []string, group string) (int, error) {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
	res, err := client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: group, KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err != nil {
		return 0, err
	}
	if res.Error != nil {
		return 0, res.Error
	}
	if res.Coordinator == nil {
		return 0, errors.New("no coordinator")
	}
	return res.Coordinator.NodeID, nil
}
