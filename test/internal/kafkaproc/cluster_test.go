package kafkaproc_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/idemkit/idemkit/test/internal/kafkaproc"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if t, ok := kafka.DefaultTransport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "kafkaproc: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestClusterLeaderMoves starts a three-node cluster, kills the leader of a
// partition and sees another node lead it with the ISR shrunk to the two
// nodes left, then starts the node again and sees the ISR full again.
//
// It runs with IDEMKIT_CLUSTER=1 (scripts/test-cluster): the module's run
// already starts a cluster in test/cluster, whose LeaderKilled uses every
// method exercised here.
func TestClusterLeaderMoves(t *testing.T) {
	if os.Getenv("IDEMKIT_CLUSTER") != "1" {
		t.Skip("opt-in: IDEMKIT_CLUSTER=1 go test -race -count=1 -run TestClusterLeaderMoves ./internal/kafkaproc/ (in the test module)")
	}
	began := time.Now()
	c := kafkaproc.StartCluster(t)
	t.Logf("cluster up in %s: %v", time.Since(began).Round(time.Millisecond), c.Addrs())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const topic = "moves"
	if err := c.CreateTopic(ctx, topic, 3, 3); err != nil {
		t.Fatal(err)
	}
	st, err := c.Partition(ctx, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Leader < 1 || len(st.ISR) != 3 {
		t.Fatalf("new topic: partition 0 is %+v, want a leader and three in-sync replicas", st)
	}
	old := st.Leader
	if err := c.Node(old).Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		st, err = c.Partition(ctx, topic, 0)
		if err == nil && st.Leader > 0 && st.Leader != old && len(st.ISR) == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("after node %d was killed: partition 0 is %+v (%v), want another leader and an ISR of two", old, st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("node %d killed: node %d leads after %s, ISR %v", old, st.Leader, time.Since(killed).Round(time.Millisecond), st.ISR)
	if err := c.Node(old).Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitISR(ctx, topic); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d back in every ISR after %s", old, time.Since(killed).Round(time.Millisecond))
}
