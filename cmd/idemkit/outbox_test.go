package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// TestCLIOutboxAndDedup drives `idemkit outbox stats|dead|retry` and
// `idemkit dedup purge` as an operator would: a message to a topic that does
// not exist is dead with its error, the dead list shows it, the topic is
// created, `retry` requeues it and the relay publishes it.
func TestCLIOutboxAndDedup(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t)}
	schema := []string{"-schema", db.Schema}
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	missing := testenv.Name(t, "later") // created only after the message is dead
	var ids []string
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		ids, err = store.EnqueueTx(ctx, tx, outbox.Message{Topic: missing, Key: []byte("acct-1"), Value: []byte("invoice")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	dead := make(chan struct{}, 1)
	published := make(chan struct{}, 1)
	relay, err := outbox.NewRelay(db.Pool, store, &outbox.RelayConfig{Kafka: testenv.Kafka(t), MetadataTTL: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Observers: []outbox.Observer{&testobs.Outbox{ // signals only: a hook must never block the relay
			OnDead:      func(outbox.Record, error) { notify(dead) },
			OnPublished: func([]outbox.Record) { notify(published) },
		}}, Retry: retry.Policy{InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxAttempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-dead:
	case <-time.After(30 * time.Second):
		t.Fatal("the message did not die")
	}

	out, errOut, code := cli(t, bin, env, append([]string{"outbox", "stats"}, schema...)...)
	if code != 0 || !strings.Contains(out, "dead 1") {
		t.Fatalf("stats: %d %s%s", code, out, errOut)
	}
	out, _, code = cli(t, bin, env, append([]string{"outbox", "dead"}, schema...)...)
	if code != 0 || !strings.Contains(out, ids[0]) || !strings.Contains(out, missing) || !strings.Contains(out, "1 dead message(s)") {
		t.Fatalf("dead: %d\n%s", code, out)
	}
	_, errOut, code = cli(t, bin, env, append([]string{"outbox", "retry", "00000000-0000-4000-8000-000000000000"}, schema...)...)
	if code != 1 || !strings.Contains(errOut, "is dead") {
		t.Fatalf("retry of an unknown ID: %d %q", code, errOut)
	}
	if _, errOut, code = cli(t, bin, env, append([]string{"outbox", "retry"}, schema...)...); code != 2 {
		t.Fatalf("retry without IDs: exit %d, want 2 (%q)", code, errOut)
	}

	testenv.CreateTopic(t, missing, 1)
	out, _, code = cli(t, bin, env, append([]string{"outbox", "retry", ids[0]}, schema...)...)
	if code != 0 || !strings.Contains(out, "requeued 1 message(s)") {
		t.Fatalf("retry: %d %s", code, out)
	}
	select {
	case <-published:
	case <-time.After(30 * time.Second):
		t.Fatal("the requeued message was not published")
	}

	// dedup purge: only records older than the retention go.
	d, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, id := range []string{"old-1", "old-2", "new"} {
			if _, err := d.ClaimTx(ctx, tx, dedup.Claim{Consumer: "billing", MessageID: id, Topic: "t"}); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `UPDATE `+db.Table(migrate.ProcessedMessagesDefault)+
			` SET processed_at = now() - interval '8 days' WHERE message_id LIKE 'old-%'`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := cli(t, bin, env, append([]string{"dedup", "purge"}, schema...)...); code != 2 || !strings.Contains(errOut, "-older-than") {
		t.Fatalf("purge without retention: %d %q", code, errOut)
	}
	out, _, code = cli(t, bin, env, append([]string{"dedup", "purge", "-older-than", "168h"}, schema...)...)
	if code != 0 || !strings.Contains(out, "purged 2 record(s)") {
		t.Fatalf("purge: %d %s", code, out)
	}
	if ok, err := d.Processed(ctx, db.Pool, "billing", "new"); err != nil || !ok {
		t.Fatalf("the recent record was purged too (%v, %v)", ok, err)
	}
}

// notify wakes a waiter without ever blocking.
func notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
