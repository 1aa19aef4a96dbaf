package idemtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/idemtest"
)

// TestNilPool: the kit refuses a nil pool as every idemkit constructor
// does, with an error matching idemkit.ErrInvalidConfig.
func TestNilPool(t *testing.T) {
	if _, err := idemtest.CreateSchema(context.Background(), nil); !errors.Is(err, idemkit.ErrInvalidConfig) {
		t.Errorf("CreateSchema(nil): %v, want ErrInvalidConfig", err)
	}
	if _, err := idemtest.NewConsumer(nil, &consumer.Config{}); !errors.Is(err, idemkit.ErrInvalidConfig) {
		t.Errorf("NewConsumer(nil, …): %v, want ErrInvalidConfig", err)
	}
}
