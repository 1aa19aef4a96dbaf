// Package cluster runs idemkit's consumers and outbox relays against a
// private three-node Kafka cluster (test/internal/kafkaproc.StartCluster:
// KRaft, each node a broker and a controller voter, topics on three
// replicas with min.insync.replicas=2) while the test takes nodes away (see
// TestCluster): the leader of the busiest partition SIGKILLed under three
// consumer runners of one group, two outbox relays and an acks=all producer;
// the group coordinator's node stopped (SIGTERM) and started again; a topic
// held below min.insync.replicas under a relay.
//
// Each checks, in PostgreSQL and by reading the topic back, that nothing is
// lost, nothing is applied twice (one effect and one claim per message ID),
// each key's messages are applied in order, and every message a relay
// reported delivered is in Kafka, read from the nodes left while the node
// taken away is still down.
//
// The CI-sized subtests run with the rest of the test module; the long ones
// (a node stopped for a full minute, four times the messages) only with
// IDEMKIT_CLUSTER=1, which scripts/test-cluster sets (it runs them from
// nothing):
//
//	IDEMKIT_CLUSTER=1 scripts/test-cluster
//	cd test && IDEMKIT_CLUSTER=1 go test -race -count=1 -timeout 40m -v ./cluster/
//
// PostgreSQL is the shared test server (testenv: a fresh schema per
// subtest); the Kafka jars are those scripts/dev start installs
// (IDEMKIT_KAFKA_LIBS names their folder when the checkout has no .dev of
// its own).
package cluster

import (
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func TestMain(m *testing.M) {
	testenv.Main(m, containers.Start)
}
