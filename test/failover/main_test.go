// Package failover runs idemkit's consumer runners and outbox relays against
// a PostgreSQL primary with a synchronous streaming standby of their own
// (test/internal/pgproc StartPair: Debian's PostgreSQL binaries, the standby
// made by pg_basebackup), connected through pgxpool with a multi-host URL
// and target_session_attrs=read-write, while the test kills the primary with
// SIGKILL and promotes the standby mid-stream. Kafka is the shared test
// broker (unique topics). Every part must wait the failover out without
// returning, log the outage's start and end, and leave every message
// applied exactly once, in order per key, with every outbox message
// published.
//
// TestFailover runs with the rest of the test module (see its doc comment
// for its duration). It needs PostgreSQL's server binaries (scripts/dev
// start installs them); without them it fails with a one-line fix.
package failover

import (
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func TestMain(m *testing.M) { testenv.Main(m, containers.Start) }
