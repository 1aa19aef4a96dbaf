// Package dlq holds the dead-letter tests that need a Kafka broker of their
// own: a broker killed and started again in the middle of a replay, and
// while a dead letter is being written.
package dlq

import (
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func TestMain(m *testing.M) { testenv.Main(m, containers.Start) }
