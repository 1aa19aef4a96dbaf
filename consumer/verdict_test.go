package consumer_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestPermanentErrorWrappingEOFStops: a handler marks a truncated payload
// permanent (retry.Permanent(io.ErrUnexpectedEOF)); without OnFailure Run
// returns the *MessageError at once: an error that wraps io.EOF is the
// handler's verdict, not an outage to retry for ever as a "server
// unreachable".
func TestPermanentErrorWrappingEOFStops(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("poison", "k", 1))
			calls := 0
			cfg := e.config(md, func(context.Context, *consumer.Message) error {
				calls++
				return retry.Permanent(io.ErrUnexpectedEOF)
			})
			var outages int
			testobs.Of(cfg).OnOutageStarted = func(string, error) { outages++ }
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			err = r.Run(ctx)
			t.Logf("Run = %v after %d handler calls, %d outages reported", err, calls, outages)
			var merr *consumer.MessageError
			if !errors.As(err, &merr) || calls != 1 || outages != 0 {
				t.Fatalf("Run = %v after %d handler calls and %d outages; want the *MessageError after 1 call, no outage", err, calls, outages)
			}
		})
	}
}
