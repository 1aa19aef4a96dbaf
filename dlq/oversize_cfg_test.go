package dlq_test

import (
	"context"
	"time"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// oversizeWriterConfig is the writer of the oversize tests: values too large
// for the dead-letter topic go to the test's schema.
func oversizeWriterConfig(e *env) *dlq.WriterConfig {
	return &dlq.WriterConfig{Kafka: testenv.Kafka(e.t), Group: e.group, Logger: e.logger,
		Pool: e.db.Pool, Tables: migrate.Tables{Schema: e.db.Schema}}
}

// noPoolWriterConfig is a writer without Pool that calls refused after each
// failed write.
func noPoolWriterConfig(e *env, refused func()) *dlq.WriterConfig {
	return &dlq.WriterConfig{Kafka: testenv.Kafka(e.t), Group: e.group, Logger: e.logger,
		Retry:       retry.Policy{InitialInterval: 20 * time.Millisecond, MaxInterval: 100 * time.Millisecond, MaxAttempts: -1, MaxElapsedTime: -1},
		WriteFailed: func(context.Context, *dlq.WriteFailure) { refused() }}
}
