package console

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/outbox"
)

// deadOutboxMessage enqueues a message and marks it given up on, as a relay
// does once its retries are used up: the outbox's names for that state are
// in this file and names.go only.
func (e *env) deadOutboxMessage(topic, key, lastError string) string {
	e.t.Helper()
	ctx := context.Background()
	store, err := outbox.New(&outbox.Config{Tables: e.console.tables})
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		ids, err = store.EnqueueTx(ctx, tx, outbox.Message{Topic: topic, Key: []byte(key), Value: []byte("{}")})
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(ctx, `UPDATE `+e.db.Table(e.console.tables.Outbox)+
		` SET dead_at = now(), attempts = 5, last_error = $2 WHERE id = $1`, ids[0], lastError); err != nil {
		e.t.Fatal(err)
	}
	return ids[0]
}
