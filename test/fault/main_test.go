// Package fault holds idemkit's fault tests: processes killed with SIGKILL at
// chosen points, and consumer instances joining and leaving a group under
// load, all against the real servers.
package fault

import (
	"os"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func TestMain(m *testing.M) {
	// The crash tests run this same binary as the consumer process they kill.
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	testenv.Main(m, containers.Start)
}
