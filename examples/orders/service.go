package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
)

// This file is the order service itself: its event, its tables and its
// handler. The rest of the program is the demo around it.

// OrderPaid is the event the payment service publishes once an order is paid.
// Its ID is not in the payload: it travels in the "message-id" header
// (consumer.IDHeaderDefault), and stays the same on every retry or replay of
// the event.
type OrderPaid struct {
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"` // in cents
}

//go:embed schema.sql
var schemaSQL string

// markPaid is the handler. The runner calls it inside the transaction in
// which it claimed the event's ID in processed_messages, and commits both
// together before it commits the Kafka offset; for an ID claimed before, it
// does not call it at all.
//
// Setting the status to 'paid' is idempotent by itself. Adding the amount to
// the account's balance is not: run twice, it counts the payment twice. That
// is the effect the dedup claim protects, and the one the demo checks.
func markPaid(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
	var ev OrderPaid
	if err := json.Unmarshal(msg.Value, &ev); err != nil {
		return fmt.Errorf("decode OrderPaid: %w", err)
	}
	var account string
	err := tx.QueryRow(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1 RETURNING account_id`,
		ev.OrderID).Scan(&account)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("order %q not found", ev.OrderID)
	}
	if err != nil {
		return fmt.Errorf("mark %s paid: %w", ev.OrderID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`,
		account, ev.Amount); err != nil {
		return fmt.Errorf("credit account %s: %w", account, err)
	}
	return nil
}
