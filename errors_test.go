package idemkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

func TestPanicError(t *testing.T) {
	boom := errors.New("boom")
	var err error
	func() {
		defer func() { err = idemkit.NewPanicError("consumer: handler", recover()) }()
		panic(fmt.Errorf("wrapped: %w", boom))
	}()
	var perr *idemkit.PanicError
	if !errors.As(err, &perr) || !errors.Is(err, boom) || len(perr.Stack) == 0 {
		t.Fatalf("err = %v; want a *PanicError with a stack that unwraps to boom", err)
	}
	if got := err.Error(); got != "consumer: handler panicked: wrapped: boom" || strings.Contains(got, "goroutine") {
		t.Fatalf("Error() = %q", got)
	}
	if (&idemkit.PanicError{Value: 42}).Unwrap() != nil {
		t.Fatal("a non-error panic value unwraps to something")
	}
}

// Every package's ErrNotMigrated matches idemkit.ErrNotMigrated: one check
// for "run migrate up" whichever store said it.
func TestErrNotMigratedEverywhere(t *testing.T) {
	for name, err := range map[string]error{
		"consumer": consumer.ErrNotMigrated, "dedup": dedup.ErrNotMigrated, "outbox": outbox.ErrNotMigrated,
		"dlq": dlq.ErrNotMigrated, "idemhttp": idemhttp.ErrNotMigrated,
	} {
		if !errors.Is(err, idemkit.ErrNotMigrated) || !strings.HasPrefix(err.Error(), name+":") {
			t.Errorf("%s.ErrNotMigrated = %q: want it to match idemkit.ErrNotMigrated and name its package", name, err)
		}
	}
}

// Every constructor refuses a nil pool (or backend) with its package's
// ErrInvalidConfig, and every package's ErrInvalidConfig matches
// idemkit.ErrInvalidConfig: one shape for "where it runs" (the pool is the
// first argument) and one check for a refused configuration.
func TestErrInvalidConfigEverywhere(t *testing.T) {
	kc := kafkaconn.Config{Brokers: []string{"127.0.0.1:1"}}
	h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	store, err := outbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	nilPool := func(_ *migrate.Migrator, err error) error { return err }
	for name, c := range map[string]struct{ pkg, err error }{
		"consumer.New": {consumer.ErrInvalidConfig, func() error {
			_, err := consumer.New(nil, &consumer.Config{Kafka: kc, Topic: "t", GroupID: "g", Handler: h})
			return err
		}()},
		"dlq.NewReprocessor": {dlq.ErrInvalidConfig, func() error {
			_, err := dlq.NewReprocessor(nil, &dlq.ReprocessorConfig{Kafka: kc, Topic: "t.dlq", Mode: dlq.Republish})
			return err
		}()},
		"dlq.NewWriter": {dlq.ErrInvalidConfig, func() error { _, err := dlq.NewWriter(&dlq.WriterConfig{}); return err }()},
		"migrate.New":   {migrate.ErrInvalidConfig, nilPool(migrate.New(nil, nil))},
		"dedup.New": {migrate.ErrInvalidConfig, func() error {
			_, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: strings.Repeat("s", 64)}})
			return err
		}()},
		"outbox.NewRelay": {outbox.ErrInvalidConfig, func() error {
			_, err := outbox.NewRelay(nil, store, &outbox.RelayConfig{Kafka: kc})
			return err
		}()},
		"outbox.NewDispatcher": {outbox.ErrInvalidConfig, func() error {
			_, err := outbox.NewDispatcher(nil, store, &outbox.DispatcherConfig{})
			return err
		}()},
		"idemhttp.New": {idemhttp.ErrInvalidConfig, func() error { _, err := idemhttp.New(nil, nil); return err }()},
		"idemhttp.NewWithBackend": {idemhttp.ErrInvalidConfig, func() error {
			_, err := idemhttp.NewWithBackend(nil, nil)
			return err
		}()},
		"kafkaconn.Validate": {kafkaconn.ErrInvalidConfig, (&kafkaconn.Config{}).Validate()},
		"idemhttp.Store.Backend": {idemhttp.ErrInvalidConfig, func() error {
			s, err := idemhttp.NewStore(nil)
			if err != nil {
				return err
			}
			_, err = s.Backend(nil)
			return err
		}()},
	} {
		if !errors.Is(c.err, c.pkg) || !errors.Is(c.err, idemkit.ErrInvalidConfig) {
			t.Errorf("%s: %v; want an error matching its package's ErrInvalidConfig and idemkit.ErrInvalidConfig", name, c.err)
		}
	}
	for name, err := range map[string]error{"consumer": consumer.ErrInvalidConfig, "dlq": dlq.ErrInvalidConfig,
		"migrate": migrate.ErrInvalidConfig, "outbox": outbox.ErrInvalidConfig, "idemhttp": idemhttp.ErrInvalidConfig,
		"kafkaconn": kafkaconn.ErrInvalidConfig} {
		if want := name + ": invalid config"; err.Error() != want {
			t.Errorf("%s.ErrInvalidConfig = %q, want %q", name, err, want)
		}
	}
}

// On a schema with nothing migrated, each store's error matches its
// package's ErrNotMigrated and idemkit.ErrNotMigrated, names its package
// once (one prefix per layer) and says how to migrate.
func TestNotMigratedErrorText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t) // no migrations
	ds, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	hs, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	_, dedupErr := ds.Processed(ctx, db.Pool, "billing", "m")
	_, outboxErr := ob.Stats(ctx, db.Pool)
	_, httpErr := hs.Get(ctx, db.Pool, "acct", "POST /payments", "k")
	_, parkedErr := consumer.ListParked(ctx, db.Pool, ds, consumer.ParkedQuery{Consumer: "billing", Topic: "orders"})
	for _, c := range []struct {
		pkg           string
		err, sentinel error
	}{
		{"dedup", dedupErr, dedup.ErrNotMigrated},
		{"outbox", outboxErr, outbox.ErrNotMigrated},
		{"idemhttp", httpErr, idemhttp.ErrNotMigrated},
		{"consumer", parkedErr, consumer.ErrNotMigrated},
	} {
		if !errors.Is(c.err, c.sentinel) || !errors.Is(c.err, idemkit.ErrNotMigrated) {
			t.Errorf("%s: %v: want it to match %s.ErrNotMigrated and idemkit.ErrNotMigrated", c.pkg, c.err, c.pkg)
			continue
		}
		msg := c.err.Error()
		if !strings.HasPrefix(msg, c.pkg+": ") || strings.Count(msg, c.pkg+":") != 1 ||
			strings.Count(msg, "idemkit:") != 0 || !strings.Contains(msg, "run migrate.Up or idemkit migrate up") {
			t.Errorf("%s: %q: want one %q prefix and the way to migrate", c.pkg, msg, c.pkg+":")
		}
	}
}
