// Package cluster runs idemkit's consumers and outbox relays against a
// private three-node Kafka cluster (test/internal/kafkaproc.StartCluster:
// KRaft, each node a broker and a controller voter, topics on three
// replicas with min.insync.replicas=2) while the test takes nodes away:
//
//   - TestLeaderKilled: the leader of the busiest partition is killed with
//     SIGKILL while three consumer runners of one group and two relays run,
//     and a producer with acks=all writes beside the relays; the node is
//     started again afterwards.
//   - TestBrokerStopped: a node is stopped (SIGTERM) for BrokerStopShort
//     and comes back.
//   - TestRelayBelowMinISR: a relay's messages cannot reach
//     min.insync.replicas (one of the two replicas of a topic is down): the
//     relay must not report them published until the replica is back.
//
// Each checks, in PostgreSQL and by reading the topic back, that nothing is
// lost, nothing is applied twice (one effect and one claim per message ID),
// each key's messages are applied in order, and every message a relay
// reported delivered is in Kafka, read from the nodes left while the killed
// one is still down.
//
// The CI-sized variants run with the rest of the test module (each starts
// its own cluster, about 25s on two cores). The long variant, with the node
// stopped for a full minute (BrokerStopLong) and more messages, runs only
// with IDEMKIT_CLUSTER=1 (scripts/test-cluster runs it from nothing):
//
//	IDEMKIT_CLUSTER=1 scripts/test-cluster
//	cd test && IDEMKIT_CLUSTER=1 go test -race -count=1 -timeout 20m -v ./cluster/
//
// PostgreSQL is the shared test server (testenv: a fresh schema per test);
// the Kafka jars are those scripts/dev start installs (IDEMKIT_KAFKA_LIBS
// names their folder when the checkout has no .dev of its own).
package cluster

import (
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func TestMain(m *testing.M) {
	testenv.Main(m, containers.Start)
}
