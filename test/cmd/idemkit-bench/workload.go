package main

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// The workload: message i moves amountOf(i) into account accountOf(i). An
// account always lands on the same partition (account % partitions), on
// Kafka and in the PostgreSQL-alone scenarios alike, so that partitions never
// update the same row and the two sides take the same row locks.

const accountPrefix = "acct-"

func accountOf(i, accounts int) int { return i % accounts }

func amountOf(i int) int64 { return int64(i%100 + 1) }

func accountKey(a int) string { return accountPrefix + strconv.Itoa(a) }

// sumAmounts is the balance total that n messages must leave.
func sumAmounts(n int) int64 {
	var s int64
	for i := range n {
		s += amountOf(i)
	}
	return s
}

// accountBalancer sends a message to partition account % partitions, the
// account being parsed from the key.
var accountBalancer = kafka.BalancerFunc(func(m kafka.Message, partitions ...int) int {
	a, _ := strconv.Atoi(strings.TrimPrefix(string(m.Key), accountPrefix))
	return partitions[a%len(partitions)]
})

// accountsDDL is the business table; %s is its qualified name.
const accountsDDL = `CREATE TABLE %s (
	id      text   PRIMARY KEY,
	balance bigint NOT NULL,
	updated int    NOT NULL)`

// effect is one message's business effect.
type effect struct {
	account string
	amount  int64
}

// upsertOne applies one effect: the per-message handler's statement.
func upsertOne(ctx context.Context, tx pgx.Tx, table string, e effect) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` AS a (id, balance, updated) VALUES ($1, $2, 1)
	ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance, updated = a.updated + 1`,
		e.account, e.amount)
	return err
}

// upsertSet applies many effects in one statement. ON CONFLICT cannot update
// a row twice in one statement, so effects are summed per account first; the
// rows are written in key order so that concurrent batches lock in one order.
func upsertSet(ctx context.Context, tx pgx.Tx, table string, effects []effect) error {
	type total struct {
		amount int64
		count  int32
	}
	totals := make(map[string]total, len(effects))
	for _, e := range effects {
		t := totals[e.account]
		t.amount += e.amount
		t.count++
		totals[e.account] = t
	}
	ids := make([]string, 0, len(totals))
	for id := range totals {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	amounts := make([]int64, len(ids))
	counts := make([]int32, len(ids))
	for i, id := range ids {
		amounts[i], counts[i] = totals[id].amount, totals[id].count
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` AS a (id, balance, updated)
	SELECT * FROM unnest($1::text[], $2::bigint[], $3::int[])
	ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance, updated = a.updated + excluded.updated`,
		ids, amounts, counts)
	return err
}
