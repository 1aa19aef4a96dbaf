package retry_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The retry package needs no server; goleak still checks its goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
