package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// TestDispatcherErrorTextIsStored: a handler error whose text cannot
// be stored as is (a NUL byte; more than 2,000 bytes cut inside a UTF-8
// character) is still recorded, made storable (internal/pgtext), the message
// retried until it is dead, and the other messages delivered once. Stored
// raw, PostgreSQL rejects both with SQLSTATE 22021, the round fails, and the
// same round is tried again for ever, re-running the healthy handlers.
func TestDispatcherErrorTextIsStored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, text string }{
		{"nul", "provider said \x00 garbage"},
		{"cut-utf8", strings.Repeat("x", 1999) + "é and more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, store := newDB(t)
			var fineCalls atomic.Int64
			defer func() { t.Logf("handler calls for the healthy message: %d", fineCalls.Load()) }()
			h := outbox.HandlerFunc(func(ctx context.Context, rec *outbox.Record) error {
				if string(rec.Value) == "fine" {
					fineCalls.Add(1)
				}
				if string(rec.Value) == "poison" {
					return errors.New(tc.text)
				}
				return nil
			})
			pub := newPublished()
			d, err := outbox.NewDispatcher(db.Pool, store, &outbox.DispatcherConfig{
				Handlers:     map[string]outbox.Handler{"email": h},
				PollInterval: 50 * time.Millisecond, Logger: testLogger(t), Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}, Retry: retry.Policy{InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxAttempts: 2}})
			if err != nil {
				t.Fatal(err)
			}
			run(t, d)
			ids := enqueue(t, db.Pool, store,
				outbox.Message{Handler: "email", Key: []byte("a"), Value: []byte("poison")},
				outbox.Message{Handler: "email", Key: []byte("b"), Value: []byte("fine")},
			)
			pub.wait(t, 15*time.Second, ids[1])
			deadline := time.Now().Add(15 * time.Second)
			for {
				dead, err := store.Dead(ctx, db.Pool)
				if err != nil {
					t.Fatal(err)
				}
				if len(dead) == 1 {
					got := dead[0].Error
					if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 || len(got) > 2000 {
						t.Fatalf("stored error text %q (%d bytes): not storable as is", got, len(got))
					}
					if want := tc.text[:10]; !strings.HasPrefix(got, want) {
						t.Fatalf("stored error text %q, want it to start with %q", got, want)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("poison never died: dead %+v", dead)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// The healthy message was delivered in the round that recorded
			// the failure, not again in rounds rolled back and retried.
			if n := fineCalls.Load(); n != 1 {
				t.Fatalf("healthy message handled %d times, want 1", n)
			}
		})
	}
}
