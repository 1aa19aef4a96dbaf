package webhook_test

import (
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }
