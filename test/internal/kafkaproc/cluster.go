package kafkaproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// ClusterSize is the number of nodes of a Cluster.
const ClusterSize = 3

// MinInsyncReplicas is the cluster's min.insync.replicas: a write with
// acks=all succeeds only once this many replicas (the leader included) have
// it.
const MinInsyncReplicas = 2

// clusterSettings are the settings every node of a Cluster shares: topics
// (internal ones included) on three replicas, two of which must hold a
// write before it is acknowledged, and no unclean leader election (a replica
// that fell out of sync never becomes leader, so acknowledged writes
// survive a leader's crash). replica.lag.time.max.ms is Kafka's default,
// written out: a follower that stops fetching leaves the ISR after 30s.
const clusterSettings = `default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
replica.lag.time.max.ms=30000
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
`

// Cluster is a private three-node KRaft cluster for one test: each node is a
// broker and one of the three controller voters (combined mode: a killed node
// also takes a voter down, and two of three keep the quorum). Its topics
// default to three replicas with min.insync.replicas=2. Each node can be
// stopped (SIGTERM or SIGKILL) and started again on its data.
type Cluster struct {
	// Nodes are the brokers; Nodes[i].ID is i+1.
	Nodes []*Broker
}

// StartCluster formats and starts three nodes on free loopback ports, waits
// until every broker is registered (the metadata of each lists all three),
// and kills them and removes their files at cleanup. It fails the test with
// a one-line message when the jars or Java are missing.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	libs := mustPrereqs(tb)
	ports := freePorts(tb, 2*ClusterSize)
	var voters []string
	for i := range ClusterSize {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, ports[ClusterSize+i]))
	}
	root := tb.TempDir()
	c := &Cluster{}
	for i := range ClusterSize {
		dir := filepath.Join(root, fmt.Sprintf("node-%d", i+1))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		c.Nodes = append(c.Nodes, newNode(tb, dir, libs, i+1, ports[i], ports[ClusterSize+i],
			strings.Join(voters, ","), clusterSettings))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := newClusterID(tb)
	if err := c.each(func(b *Broker) error { return b.format(ctx, id) }); err != nil {
		tb.Fatal(err)
	}
	for _, b := range c.Nodes {
		b.cleanup(tb)
	}
	// The nodes wait for each other (the quorum needs two voters): start
	// them together.
	if err := c.each(func(b *Broker) error { return b.Start(ctx) }); err != nil {
		tb.Fatal(err)
	}
	if err := c.WaitBrokers(ctx); err != nil {
		tb.Fatal(err)
	}
	// The first group coordinator request creates __consumer_offsets (three
	// replicas); until its partitions have leaders, groups wait with
	// "coordinator not available". Have it made now.
	if err := c.waitCoordinator(ctx); err != nil {
		tb.Fatal(err)
	}
	return c
}

// waitCoordinator waits until a group coordinator can be found.
func (c *Cluster) waitCoordinator(ctx context.Context) error {
	tr := &kafka.Transport{DialTimeout: time.Second}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(c.Addrs()...), Timeout: 5 * time.Second, Transport: tr}
	for {
		res, err := client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: "kafkaproc-warmup",
			KeyType: kafka.CoordinatorKeyTypeConsumer})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkaproc: no group coordinator: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// StartStopped starts every node that is stopped (after a test that failed
// before it started them again, when tests share a cluster) and waits until
// every node lists every broker and a group coordinator can be found.
func (c *Cluster) StartStopped(ctx context.Context) error {
	if err := c.each(func(b *Broker) error {
		if b.Running() {
			return nil
		}
		return b.Start(ctx)
	}); err != nil {
		return err
	}
	if err := c.WaitBrokers(ctx); err != nil {
		return err
	}
	return c.waitCoordinator(ctx)
}

// each runs fn for every node at once and returns the first error.
func (c *Cluster) each(fn func(*Broker) error) error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, b := range c.Nodes {
		wg.Go(func() { errs[i] = fn(b) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Addrs returns the bootstrap addresses of every node.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, b := range c.Nodes {
		out = append(out, b.Addr)
	}
	return out
}

// Node returns the node whose node.id is id, or nil.
func (c *Cluster) Node(id int) *Broker {
	if id < 1 || id > len(c.Nodes) {
		return nil
	}
	return c.Nodes[id-1]
}

// Others returns the addresses of every node but the one of node.id id.
func (c *Cluster) Others(id int) []string {
	var out []string
	for _, b := range c.Nodes {
		if b.ID != id {
			out = append(out, b.Addr)
		}
	}
	return out
}

// metadata asks the first node of addrs that answers for fresh metadata
// (through a transport of its own: kafka-go's transports answer from a
// cache).
func metadata(ctx context.Context, addrs []string, topics ...string) (*kafka.MetadataResponse, error) {
	var last error
	for _, a := range addrs {
		tr := &kafka.Transport{DialTimeout: time.Second}
		client := &kafka.Client{Addr: kafka.TCP(a), Timeout: 5 * time.Second, Transport: tr}
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		tr.CloseIdleConnections()
		if err == nil {
			return md, nil
		}
		last = err
	}
	return nil, fmt.Errorf("kafkaproc: metadata: no node answered: %w", last)
}

// PartitionState is a partition's leader, replicas and in-sync replicas,
// by node.id.
type PartitionState struct {
	Leader   int // -1 when none
	Replicas []int
	ISR      []int
}

// Partition returns the state of one partition as the metadata of a running
// node says.
func (c *Cluster) Partition(ctx context.Context, topic string, partition int) (PartitionState, error) {
	md, err := metadata(ctx, c.Addrs(), topic)
	if err != nil {
		return PartitionState{}, err
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		return PartitionState{}, fmt.Errorf("kafkaproc: metadata of %s: %v", topic, md.Topics)
	}
	for _, p := range md.Topics[0].Partitions {
		if p.ID != partition {
			continue
		}
		st := PartitionState{Leader: p.Leader.ID}
		if st.Leader < 1 {
			st.Leader = -1
		}
		for _, b := range p.Isr {
			st.ISR = append(st.ISR, b.ID)
		}
		for _, b := range p.Replicas {
			st.Replicas = append(st.Replicas, b.ID)
		}
		slices.Sort(st.ISR)
		slices.Sort(st.Replicas)
		return st, nil
	}
	return PartitionState{}, fmt.Errorf("kafkaproc: %s has no partition %d", topic, partition)
}

// Leader returns the node.id of the partition's leader.
func (c *Cluster) Leader(ctx context.Context, topic string, partition int) (int, error) {
	st, err := c.Partition(ctx, topic, partition)
	if err != nil {
		return 0, err
	}
	if st.Leader < 1 {
		return 0, fmt.Errorf("kafkaproc: %s/%d has no leader", topic, partition)
	}
	return st.Leader, nil
}

// WaitBrokers waits until every running node's metadata lists every node as
// a registered broker.
func (c *Cluster) WaitBrokers(ctx context.Context) error {
	var last error
	for {
		ok := true
		for _, b := range c.Nodes {
			md, err := metadata(ctx, []string{b.Addr})
			if err != nil {
				ok, last = false, err
				break
			}
			if len(md.Brokers) != len(c.Nodes) {
				ok, last = false, fmt.Errorf("node %d lists %d brokers", b.ID, len(md.Brokers))
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkaproc: cluster not ready: %v; node logs: %s", last, c.logTails())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitISR waits until every partition of topic has a leader and all its
// replicas in sync: after a node came back, when it caught up.
func (c *Cluster) WaitISR(ctx context.Context, topic string) error {
	var last error
	for {
		md, err := metadata(ctx, c.Addrs(), topic)
		switch {
		case err != nil:
			last = err
		case len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) == 0:
			last = fmt.Errorf("topic %s not in the metadata", topic)
		default:
			last = nil
			for _, p := range md.Topics[0].Partitions {
				if p.Leader.ID < 1 || len(p.Isr) != len(p.Replicas) {
					last = fmt.Errorf("%s/%d: leader %d, ISR %d of %d replicas", topic, p.ID, p.Leader.ID, len(p.Isr), len(p.Replicas))
					break
				}
			}
			if last == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkaproc: %s not fully in sync: %v", topic, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CreateTopic creates topic with the given partitions and replication
// factor and waits until every partition has a leader and a full ISR, and
// every node lists the topic.
func (c *Cluster) CreateTopic(ctx context.Context, topic string, partitions, replicas int) error {
	client := &kafka.Client{Addr: kafka.TCP(c.Addrs()...), Timeout: 30 * time.Second}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: replicas}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("kafkaproc: create topic %s: %w", topic, err)
	}
	if err := c.WaitISR(ctx, topic); err != nil {
		return err
	}
	// Every node learns of a new topic on its own time: a client that asks
	// another node than the one WaitISR asked must find it too.
	for _, addr := range c.Addrs() {
		for {
			md, err := metadata(ctx, []string{addr}, topic)
			if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("kafkaproc: %s: node %s does not list topic %s: %v", topic, addr, topic, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func (c *Cluster) logTails() string {
	var sb strings.Builder
	for _, b := range c.Nodes {
		fmt.Fprintf(&sb, "\n--- node %d ---\n%s", b.ID, b.LogTail())
	}
	return sb.String()
}
