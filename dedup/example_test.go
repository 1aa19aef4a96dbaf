package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/migrate"
)

// A handler's transaction claims the message ID first and writes its effects
// only when the claim is new; a redelivery finds the ID and skips them.
func ExampleStore_ClaimTx() {
	ctx := context.Background()
	pool, schema, drop := exampleDB() // a pgxpool.Pool and a migrated schema on the test server
	defer drop()

	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	handle := func(offset int64) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			duplicate, err := store.ClaimTx(ctx, tx, dedup.Claim{
				Consumer: "billing", MessageID: "order-842", Topic: "orders", Partition: 0, Offset: offset,
			})
			if err != nil {
				return err
			}
			if duplicate {
				fmt.Printf("offset %d: order-842 already processed, skipped\n", offset)
				return nil
			}
			// ... the business writes, in tx ...
			fmt.Printf("offset %d: order-842 processed\n", offset)
			return nil
		})
		if err != nil {
			panic(err)
		}
	}
	handle(17)
	handle(17) // redelivered after a crash before the offset commit
	handle(90) // produced twice by a retrying producer
	// Output:
	// offset 17: order-842 processed
	// offset 17: order-842 already processed, skipped
	// offset 90: order-842 already processed, skipped
}

func ExampleStore_ClaimBatchTx() {
	ctx := context.Background()
	pool, schema, drop := exampleDB()
	defer drop()

	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	batch := []dedup.Claim{
		{Consumer: "billing", MessageID: "order-1", Topic: "orders", Partition: 0, Offset: 10},
		{Consumer: "billing", MessageID: "order-2", Topic: "orders", Partition: 0, Offset: 11},
		{Consumer: "billing", MessageID: "order-1", Topic: "orders", Partition: 0, Offset: 12},
		{Consumer: "billing", MessageID: "order-3", Topic: "orders", Partition: 1, Offset: 4},
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		duplicate, err := store.ClaimBatchTx(ctx, tx, batch)
		if err != nil {
			return err
		}
		for i, c := range batch {
			fmt.Printf("%s@%d duplicate=%v\n", c.MessageID, c.Offset, duplicate[i])
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	positions, err := store.Positions(ctx, pool, "billing", "orders")
	if err != nil {
		panic(err)
	}
	fmt.Println("next offsets:", positions)
	// Output:
	// order-1@10 duplicate=false
	// order-2@11 duplicate=false
	// order-1@12 duplicate=true
	// order-3@4 duplicate=false
	// next offsets: map[0:13 1:5]
}

func ExampleStore_Purge() {
	ctx := context.Background()
	pool, schema, drop := exampleDB()
	defer drop()

	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.ClaimTx(ctx, tx, dedup.Claim{Consumer: "billing", MessageID: "order-1", Topic: "orders"})
		return err
	})
	if err != nil {
		panic(err)
	}
	// Keep records for 7 days: longer than any redelivery or replay expected.
	deleted, err := store.Purge(ctx, pool, 7*24*time.Hour, dedup.PurgeBatchDefault)
	if err != nil {
		panic(err)
	}
	fmt.Println("deleted:", deleted)
	// Output:
	// deleted: 0
}

func ExampleValidateID() {
	err := dedup.ValidateID("MessageID", "order-1\n")
	fmt.Println(err)
	fmt.Println(errors.Is(err, dedup.ErrInvalidID))
	// Output:
	// invalid MessageID "order-1\n": contains a control character
	// true
}

// An operator rewinds partition 0 of consumer billing to offset 100 and
// starts a new incarnation of the topic, which was deleted and created again.
// (Its group's Kafka offsets must move too: `idemkit consumer seek` does both.)
func ExampleStore_SeekTx() {
	ctx := context.Background()
	pool, schema, drop := exampleDB()
	defer drop()

	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return store.SavePositionTx(ctx, tx, "billing", "orders", 0, 250, time.Time{}, 0) // where the consumer got to
	})
	if err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		before, after, err := store.SeekTx(ctx, tx, "billing", "orders", map[int]int64{0: 100}, true)
		if err != nil {
			return err
		}
		fmt.Printf("partition %d: next offset %d → %d, incarnation %d → %d\n", after[0].Partition,
			before[0].Next, after[0].Next, before[0].Incarnation, after[0].Incarnation)
		return nil
	})
	if err != nil {
		panic(err)
	}
	// Output:
	// partition 0: next offset 250 → 100, incarnation 0 → 1
}
