// Package chaos runs idemkit's parts together against a PostgreSQL server
// and a Kafka broker of their own (test/internal/pgproc, kafkaproc) while the
// test crashes and restarts those servers: three consumer runners of one
// group, an outbox relay and a dead-letter reprocessor, all in this process.
// Every part must wait the outages out without returning, log each one, and
// leave every message applied exactly once, in order per key, with every
// outbox message published.
//
// TestChaos is CI-sized (8 seconds of produce, a 3-minute budget) and runs
// with the rest of the test module. The longer TestChaosLong (40 seconds of
// produce) runs only with IDEMKIT_CHAOS=1; without it, it is skipped with
// that instruction:
//
//	IDEMKIT_CHAOS=1 scripts/test -run TestChaosLong
//	cd test && IDEMKIT_CHAOS=1 go test -race -count=1 -timeout 10m -run TestChaosLong -v ./chaos/
//
// Both need PostgreSQL's server binaries and the Kafka jars that scripts/dev
// start installs (IDEMKIT_KAFKA_LIBS names the jars' folder when the
// checkout has no .dev of its own, e.g. in a git worktree); either missing
// fails the test with a one-line fix. They do not use the shared test
// servers.
package chaos

import (
	"fmt"
	"os"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// kafka-go's default transport (used by the dead-letter writers and the
	// topic reader) pools connections process-wide.
	if t, ok := kafka.DefaultTransport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
