package testenv_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
)

const childEnv = "TESTENV_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		testenv.Main(m, nil) // what every package's TestMain does
		return
	}
	os.Exit(m.Run())
}

// TestMissingServersFailLoudly: with no server named (and no starter), a test
// binary fails at once with the one-line instruction; it never skips.
func TestMissingServersFailLoudly(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=TestMissingServersFailLoudly")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMKIT_TEST_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, childEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("test binary without servers: %v, want exit status 1\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != testenv.Instruction {
		t.Fatalf("output %q, want the one-line instruction %q", got, testenv.Instruction)
	}
}
