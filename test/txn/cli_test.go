package txn

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
)

// idemkitCLI builds the idemkit command into the test's temporary directory
// and returns a runner: args in, stdout and exit code out (stderr goes to the
// test's log). The servers come from the environment, as a user's would.
func idemkitCLI(t *testing.T) func(args ...string) (string, int) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idemkit")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/idemkit/idemkit/cmd/idemkit").CombinedOutput(); err != nil {
		t.Fatalf("go build the idemkit command: %v\n%s", err, out)
	}
	env := append(os.Environ(),
		"IDEMKIT_DATABASE_URL="+testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS="+strings.Join(testenv.Brokers(t), ","))
	return func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			code = exit.ExitCode()
		case err != nil:
			t.Fatalf("idemkit %s: %v", strings.Join(args, " "), err)
		}
		if stderr.Len() > 0 {
			t.Logf("idemkit %s: stderr:\n%s", strings.Join(args, " "), stderr.String())
		}
		return stdout.String(), code
	}
}
