package dedup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/internal/pgexec"
	"github.com/idemkit/idemkit/migrate"
)

// PurgeBatchDefault is the number of rows Purge deletes per statement when
// given a batch size of zero or less.
const PurgeBatchDefault = 1000

// ErrInvalidInput matches (with errors.Is) every error for input rejected
// before any SQL runs: an invalid consumer name or message ID (which also
// matches ErrInvalidID), an empty topic, a negative partition or offset.
// Nothing is written when it is returned.
var ErrInvalidInput = errors.New("dedup: invalid input")

// inputError marks an error as ErrInvalidInput while keeping what it wraps
// reachable (errors.Is(err, ErrInvalidID), errors.As(err, **InvalidIDError)).
type inputError struct{ err error }

func (e *inputError) Error() string        { return e.err.Error() }
func (e *inputError) Unwrap() error        { return e.err }
func (e *inputError) Is(target error) bool { return target == ErrInvalidInput }

func invalid(format string, args ...any) error {
	return &inputError{err: fmt.Errorf(format, args...)}
}

// Config says where the store's tables live. They are created by package
// migrate, which must be given the same migrate.Tables.
type Config struct {
	// Tables says where the tables live (migrate.Tables; the zero value:
	// schema "public", every default name; Migrations is not used).
	Tables migrate.Tables
}

// DBTX runs queries: a pgx.Tx, a *pgxpool.Pool and a *pgx.Conn all satisfy
// it. Read-only methods take it so they can run inside or outside a
// transaction.
type DBTX = pgexec.DB

// Claim identifies one message to claim: the consumer that handles it, its
// stable ID, and where it was read.
type Claim struct {
	// Consumer names the logical consumer (typically the consumer group); IDs
	// are unique per consumer. Checked with ValidateID.
	Consumer string
	// MessageID is the message's stable ID. Checked with ValidateID.
	MessageID string
	// Topic is the Kafka topic the message was read from; not empty.
	Topic string
	// Partition is the message's partition, 0 to math.MaxInt32.
	Partition int
	// Offset is the message's offset, 0 or more.
	Offset int64
	// Time is the record's timestamp. When the claim records a position,
	// the time of the record just before that position is stored with it
	// (anchor_time), so that a consumer recognises a topic that was deleted
	// and created again. The zero Time records no anchor.
	Time time.Time
	// Epoch is the epoch of the partition's position as its writer read it
	// (Position.Epoch): the position moves only while no seek changed it.
	Epoch int64
}

func (c *Claim) validate() error {
	if err := ValidateID("Consumer", c.Consumer); err != nil {
		return &inputError{err: err}
	}
	if err := validateTopic(c.Topic); err != nil {
		return err
	}
	return c.validateMessage()
}

// validateMessage checks what differs between the claims of one consumer
// and topic.
func (c *Claim) validateMessage() error {
	if err := ValidateID("MessageID", c.MessageID); err != nil {
		return &inputError{err: err}
	}
	if err := validatePartition(c.Partition); err != nil {
		return err
	}
	if c.Offset < 0 || c.Offset == math.MaxInt64 {
		return invalid("invalid Offset %d", c.Offset)
	}
	return nil
}

func validateTopic(topic string) error {
	if topic == "" || !utf8.ValidString(topic) || strings.IndexByte(topic, 0) >= 0 {
		return invalid("invalid Topic %q: empty, not valid UTF-8 or contains NUL", topic)
	}
	return nil
}

func validatePartition(partition int) error {
	if partition < 0 || partition > math.MaxInt32 {
		return invalid("invalid Partition %d", partition)
	}
	return nil
}

// Store claims message IDs and records consumer positions in the tables
// created by package migrate. It holds no connection; its state is its SQL
// and the dedup layout it read last: it is safe for concurrent use.
type Store struct {
	tables migrate.Tables
	sql    statements
	daily  dailyNames
	layout atomic.Pointer[layoutState] // nil: not read yet
}

// New returns a Store for the tables cfg names. cfg may be nil, meaning
// every default. An invalid cfg returns an error wrapping
// migrate.ErrInvalidConfig. New does not touch the database.
func New(cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	mc := c.Tables.WithDefaults()
	if err := mc.Validate(); err != nil {
		return nil, fmt.Errorf("dedup: %w", err)
	}
	daily := newDailyNames(mc)
	st, err := newStatements(mc, daily)
	if err != nil {
		return nil, err
	}
	return &Store{tables: mc, sql: st, daily: daily}, nil
}

// Tables returns where the store's tables live, with defaults applied:
// packages that keep their own tables next to the store's use it.
func (s *Store) Tables() migrate.Tables { return s.tables }

// ClaimTx claims c.MessageID for c.Consumer in tx. duplicate is false when
// the ID is newly claimed: the claim then commits or rolls back with tx.
// duplicate is true when the ID was already claimed by a committed
// transaction (a transaction still claiming it concurrently makes ClaimTx
// wait for its outcome). Invalid input returns an error matching
// ErrInvalidInput before any SQL runs.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, c Claim) (duplicate bool, err error) {
	if err := c.validate(); err != nil {
		return false, fail("claim", err)
	}
	if tx == nil {
		return false, errors.New("dedup: claim: nil tx")
	}
	k, err := s.route(ctx, tx, c.MessageID)
	if err != nil {
		return false, fmt.Errorf("dedup: claim: %w", err)
	}
	tag, err := tx.Exec(ctx, k.pick(s.sql.claim, s.sql.claimDaily), k.claimArgs(c)...)
	if err != nil {
		return false, s.claimError("claim", err, k.day)
	}
	return tag.RowsAffected() == 0, nil
}

// storedID is where a message ID is stored: in the flat table as text
// (uuid not valid) or as a uuid, or in the daily table's partition of day.
type storedID struct {
	text  string
	uuid  pgtype.UUID
	daily bool
	day   time.Time
}

// pick returns flat or daily, for the table k is stored in.
func (k storedID) pick(flat, daily string) string {
	if k.daily {
		return daily
	}
	return flat
}

// claimArgs returns the six parameters of claim and claim_daily for c.
func (k storedID) claimArgs(c Claim, extra ...any) []any {
	args := make([]any, 0, 6+len(extra))
	switch {
	case k.daily:
		args = append(args, c.Consumer, k.uuid, k.day)
	case k.uuid.Valid:
		args = append(args, c.Consumer, nil, k.uuid)
	default:
		args = append(args, c.Consumer, k.text, nil)
	}
	args = append(args, c.Topic, c.Partition, c.Offset)
	return append(args, extra...)
}

// ClaimWithPositionTx does what ClaimTx does and, in the same statement,
// records c.Offset+1 as the consumer's next offset for c.Topic and
// c.Partition, unless a higher one is recorded already. The position is
// recorded for duplicates too: the message is done either way.
func (s *Store) ClaimWithPositionTx(ctx context.Context, tx pgx.Tx, c Claim) (duplicate bool, err error) {
	if err := c.validate(); err != nil {
		return false, fail("claim", err)
	}
	if tx == nil {
		return false, errors.New("dedup: claim: nil tx")
	}
	k, err := s.route(ctx, tx, c.MessageID)
	if err != nil {
		return false, fmt.Errorf("dedup: claim: %w", err)
	}
	err = tx.QueryRow(ctx, k.pick(s.sql.claimWithPosition, s.sql.claimWithPositionDaily),
		k.claimArgs(c, c.Offset+1, anchor(c.Time), c.Epoch)...).Scan(&duplicate)
	if err != nil {
		return false, s.claimError("claim", err, k.day)
	}
	return duplicate, nil
}

// queueClaimMove is dedupq.Queuer.QueueClaimMove. The claim and the
// UPDATE of the position row are two plain statements, where
// ClaimWithPositionTx's single statement plans and starts its INSERT of a
// missing row at every execution: less PostgreSQL CPU per message.
func (s *Store) queueClaimMove(b *pgx.Batch, c Claim, duplicate, moved *bool) error {
	if err := c.validate(); err != nil {
		return fail("claim", err)
	}
	if b == nil || duplicate == nil || moved == nil {
		return errors.New("dedup: claim: nil batch or result")
	}
	k, err := s.route(context.Background(), nil, c.MessageID)
	if err != nil {
		return fmt.Errorf("dedup: claim: %w", err)
	}
	b.Queue(k.pick(s.sql.claim, s.sql.claimDaily), k.claimArgs(c)...).Fn = func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return s.claimError("claim", err, k.day)
		}
		*duplicate = tag.RowsAffected() == 0
		return nil
	}
	b.Queue(s.sql.movePosition, c.Consumer, c.Topic, c.Partition, c.Offset+1, anchor(c.Time), c.Epoch).Fn =
		func(br pgx.BatchResults) error {
			tag, err := br.Exec()
			if err != nil {
				return fail("move position", err)
			}
			*moved = tag.RowsAffected() == 1
			return nil
		}
	return nil
}

type idKey struct{ consumer, messageID string }

type positionKey struct {
	consumer, topic string
	partition       int
}

// ClaimBatchTx claims many IDs in one statement in tx and records, for each
// (consumer, topic, partition) present, the highest offset+1 as the next
// offset (unless a higher one is recorded already). duplicate[i] reports
// whether claims[i] was a duplicate: of an ID claimed before, or of an
// earlier claim in the same batch (the first occurrence claims). Any invalid
// claim fails the whole batch before any SQL runs. An empty batch does
// nothing.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, claims []Claim) (duplicate []bool, err error) {
	if tx == nil {
		return nil, errors.New("dedup: claim batch: nil tx")
	}
	q, err := s.batchClaim(ctx, tx, claims)
	if err != nil {
		return nil, err
	}
	if q == nil {
		return []bool{}, nil
	}
	rows, err := tx.Query(ctx, q.sql, q.args...)
	if err != nil {
		return nil, s.claimError("claim batch", err, time.Time{})
	}
	return q.result(s, rows)
}

// queueClaimBatch is dedupq.Queuer.QueueClaimBatch.
func (s *Store) queueClaimBatch(b *pgx.Batch, claims []Claim, duplicate *[]bool) error {
	q, err := s.batchClaim(context.Background(), nil, claims)
	if err != nil {
		return err
	}
	if b == nil || duplicate == nil {
		return errors.New("dedup: claim batch: nil batch or result")
	}
	if q == nil {
		*duplicate = []bool{}
		return nil
	}
	b.Queue(q.sql, q.args...).Query(func(rows pgx.Rows) error {
		d, err := q.result(s, rows)
		*duplicate = d
		return err
	})
	return nil
}

// claimBatch is one prepared batch claim.
type claimBatch struct {
	sql   string
	args  []any
	n     int   // claims
	first []int // the claims that claim (first occurrences), in statement order
}

// batchClaim validates claims and builds their statement; nil for none.
// Claims of the same consumer and topic as the claim before them (the
// consumer's batches) are checked for those once. db reads the layout if a
// UUIDv7 needs it (nil: queued, see route).
func (s *Store) batchClaim(ctx context.Context, db DBTX, claims []Claim) (*claimBatch, error) {
	for i := range claims {
		c := &claims[i]
		var err error
		if i > 0 && c.Consumer == claims[i-1].Consumer && c.Topic == claims[i-1].Topic {
			err = c.validateMessage()
		} else {
			err = c.validate()
		}
		if err != nil {
			return nil, fmt.Errorf("dedup: claim batch: claims[%d]: %w", i, err)
		}
	}
	if len(claims) == 0 {
		return nil, nil
	}

	// ON CONFLICT cannot see a row inserted by the same statement twice, and
	// the answer must say which occurrence claimed: keep first occurrences.
	seen := make(map[idKey]struct{}, len(claims))
	first := make([]int, 0, len(claims)) // indexes into claims
	next := map[positionKey]int64{}
	anchors := map[positionKey]*time.Time{}
	epochs := map[positionKey]int64{}
	for i, c := range claims {
		pk := positionKey{c.Consumer, c.Topic, c.Partition}
		epochs[pk] = c.Epoch
		if c.Offset+1 > next[pk] {
			next[pk], anchors[pk] = c.Offset+1, anchor(c.Time)
		}
		k := idKey{c.Consumer, c.MessageID}
		if _, ok := seen[k]; ok {
			continue
		}
		seen[k] = struct{}{}
		first = append(first, i)
	}
	// A stable order of inserts and row locks keeps concurrent batches that
	// overlap from deadlocking.
	slices.SortFunc(first, func(a, b int) int {
		return cmp.Or(strings.Compare(claims[a].Consumer, claims[b].Consumer),
			strings.Compare(claims[a].MessageID, claims[b].MessageID))
	})
	ids := make([]*string, len(first)) // text IDs; nil where the ID is a uuid
	uuids := make([]pgtype.UUID, len(first))
	days := make([]pgtype.Date, len(first)) // for the daily table; NULL elsewhere
	offsets := make([]int64, len(first))
	for j, i := range first {
		k, err := s.route(ctx, db, claims[i].MessageID)
		if err != nil {
			return nil, fmt.Errorf("dedup: claim batch: %w", err)
		}
		switch {
		case k.daily:
			days[j] = pgtype.Date{Time: k.day, Valid: true}
		case !k.uuid.Valid:
			ids[j] = &claims[i].MessageID
		}
		uuids[j], offsets[j] = k.uuid, claims[i].Offset
	}
	q := &claimBatch{n: len(claims), first: first}
	if len(next) == 1 { // one consumer, topic and partition: the consumer's batches
		c := claims[0]
		pk := positionKey{c.Consumer, c.Topic, c.Partition}
		q.sql = s.sql.claimBatchPartition
		q.args = []any{c.Consumer, ids, c.Topic, offsets, int32(c.Partition), next[pk], anchors[pk], epochs[pk], uuids, days}
		return q, nil
	}
	consumers := make([]string, len(first))
	topics := make([]string, len(first))
	partitions := make([]int32, len(first))
	for j, i := range first {
		c := claims[i]
		consumers[j], topics[j], partitions[j] = c.Consumer, c.Topic, int32(c.Partition)
	}
	keys := make([]positionKey, 0, len(next))
	for k := range next {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b positionKey) int {
		return cmp.Or(strings.Compare(a.consumer, b.consumer), strings.Compare(a.topic, b.topic),
			cmp.Compare(a.partition, b.partition))
	})
	pConsumers := make([]string, len(keys))
	pTopics := make([]string, len(keys))
	pPartitions := make([]int32, len(keys))
	pNext := make([]int64, len(keys))
	pAnchors := make([]*time.Time, len(keys))
	pEpochs := make([]int64, len(keys))
	for j, k := range keys {
		pConsumers[j], pTopics[j], pPartitions[j], pNext[j] = k.consumer, k.topic, int32(k.partition), next[k]
		pAnchors[j], pEpochs[j] = anchors[k], epochs[k]
	}
	q.sql = s.sql.claimBatch
	q.args = []any{consumers, ids, topics, partitions, offsets, uuids, days, pConsumers, pTopics, pPartitions, pNext, pAnchors, pEpochs}
	return q, nil
}

// result reads the statement's rows: the 1-based positions in q.first of
// the claims that claimed.
func (q *claimBatch) result(s *Store, rows pgx.Rows) ([]bool, error) {
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, s.claimError("claim batch", err, time.Time{})
	}
	duplicate := make([]bool, q.n)
	for i := range duplicate {
		duplicate[i] = true
	}
	for _, ord := range claimed {
		if ord < 1 || int(ord) > len(q.first) {
			return nil, fmt.Errorf("dedup: claim batch: unexpected ordinality %d", ord)
		}
		duplicate[q.first[ord-1]] = false
	}
	return duplicate, nil
}

// anchor is the value stored as anchor_time: NULL for the zero time.
func anchor(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// validatePosition checks the arguments of a position write (op names it
// in the error).
func validatePosition(op, consumer, topic string, partition int, next int64) error {
	if err := ValidateID("Consumer", consumer); err != nil {
		return fmt.Errorf("dedup: %s: %w", op, &inputError{err: err})
	}
	if err := validateTopic(topic); err != nil {
		return fail(op, err)
	}
	if err := validatePartition(partition); err != nil {
		return fail(op, err)
	}
	if next < 0 {
		return fmt.Errorf("dedup: %s: %w", op, invalid("invalid next offset %d", next))
	}
	return nil
}

// SavePositionTx records next as consumer's next offset for topic and
// partition in tx, unless a higher one is recorded already: positions never
// move back through the store. (ClaimWithPositionTx and ClaimBatchTx already
// record positions; this is for messages handled without a claim and for
// tooling. To move a position back, use SeekTx, or the command
// `idemkit consumer seek`, which also moves Kafka's committed offsets.)
// anchorTime is the timestamp of the record at next-1; when it is zero (the
// position moves on over records without a time of their own, such as
// transaction markers) the last anchor is kept. epoch is the position's
// epoch as the writer read it (Position.Epoch): after a seek changed it, the
// position is left as it is.
func (s *Store) SavePositionTx(ctx context.Context, tx pgx.Tx, consumer, topic string, partition int, next int64, anchorTime time.Time, epoch int64) error {
	if err := validatePosition("save position", consumer, topic, partition, next); err != nil {
		return err
	}
	if tx == nil {
		return errors.New("dedup: save position: nil tx")
	}
	if _, err := tx.Exec(ctx, s.sql.savePosition, consumer, topic, partition, next, anchor(anchorTime), epoch); err != nil {
		return fail("save position", err)
	}
	return nil
}

// Positions returns consumer's next offset per partition of topic: the
// offset of the first message whose effects are not committed, as far as
// positions were recorded. Partitions without a record are absent.
func (s *Store) Positions(ctx context.Context, db DBTX, consumer, topic string) (map[int]int64, error) {
	if err := ValidateID("Consumer", consumer); err != nil {
		return nil, fmt.Errorf("dedup: positions: %w", &inputError{err: err})
	}
	if err := validateTopic(topic); err != nil {
		return nil, fail("positions", err)
	}
	records, err := s.ListPositions(ctx, db, consumer, topic)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(records))
	for _, r := range records {
		out[r.Partition] = r.Next
	}
	return out, nil
}

// Processed reports whether messageID is recorded as claimed by consumer, as
// db sees it (within a transaction, its own uncommitted claims count). After
// a record is purged, Processed reports false.
func (s *Store) Processed(ctx context.Context, db DBTX, consumer, messageID string) (bool, error) {
	if err := ValidateID("Consumer", consumer); err != nil {
		return false, fmt.Errorf("dedup: processed: %w", &inputError{err: err})
	}
	if err := ValidateID("MessageID", messageID); err != nil {
		return false, fmt.Errorf("dedup: processed: %w", &inputError{err: err})
	}
	if _, ok := uuid7Day(compactID(messageID)); ok {
		// A read, not a claim: no guard would tell it of a switch made by
		// another process since this store read the layout.
		if _, err := s.Layout(ctx, db); err != nil {
			return false, fmt.Errorf("dedup: processed: %w", err)
		}
	}
	k, err := s.route(ctx, db, messageID)
	if err != nil {
		return false, fmt.Errorf("dedup: processed: %w", err)
	}
	var ok bool
	switch {
	case k.daily:
		err = db.QueryRow(ctx, s.sql.processedDaily, consumer, k.uuid, k.day).Scan(&ok)
	case k.uuid.Valid:
		err = db.QueryRow(ctx, s.sql.processed, consumer, nil, k.uuid).Scan(&ok)
	default:
		err = db.QueryRow(ctx, s.sql.processed, consumer, messageID, nil).Scan(&ok)
	}
	if err != nil {
		return false, fail("processed", err)
	}
	return ok, nil
}

// Purge deletes the records of messages processed more than olderThan ago
// (by the database's clock, fixed when Purge starts), at most batchSize rows
// per statement, each statement its own short transaction on db, until no
// such record is left or ctx ends. It returns how many records it deleted,
// also when it returns an error. batchSize <= 0 means PurgeBatchDefault.
// Rows locked by a concurrent Purge are skipped, not waited for.
// Positions are never purged. Records in daily partitions
// are not deleted here: they go with their day's partition
// (MaintainPartitions), whatever the positions say: a consumer stopped for
// longer than KeepDays reads such messages again as new, which
// consumer.Config.Retention catches as beyond the horizon (failed, by
// default).
func (s *Store) Purge(ctx context.Context, db *pgxpool.Pool, olderThan time.Duration, batchSize int) (int64, error) {
	return s.purge(ctx, db, "", olderThan, batchSize)
}

// PurgeConsumer is Purge limited to the records of one consumer (a runner's
// Config.Name): other consumers sharing the table keep theirs.
func (s *Store) PurgeConsumer(ctx context.Context, db *pgxpool.Pool, consumer string, olderThan time.Duration, batchSize int) (int64, error) {
	if err := ValidateID("Consumer", consumer); err != nil {
		return 0, fmt.Errorf("dedup: purge: %w", &inputError{err: err})
	}
	return s.purge(ctx, db, consumer, olderThan, batchSize)
}

func (s *Store) purge(ctx context.Context, db *pgxpool.Pool, consumer string, olderThan time.Duration, batchSize int) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("dedup: purge: %w", invalid("olderThan %v is not positive", olderThan))
	}
	if db == nil {
		return 0, errors.New("dedup: purge: nil pool")
	}
	if batchSize <= 0 {
		batchSize = PurgeBatchDefault
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`,
		olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fail("purge", err)
	}
	var deleted int64
	var err error
	if consumer == "" {
		deleted, err = pgexec.DeleteInBatches(ctx, db, s.sql.purge, batchSize, cutoff)
	} else {
		deleted, err = pgexec.DeleteInBatches(ctx, db, s.sql.purgeConsumer, batchSize, consumer, cutoff)
	}
	if err != nil {
		return deleted, fail("purge", err)
	}
	return deleted, nil
}

// ErrNotMigrated means the store's tables are missing or older than the
// store needs (PostgreSQL's undefined_table or undefined_column): run
// package migrate (`idemkit migrate up`) with the same schema and names.
var ErrNotMigrated = fmt.Errorf("dedup: tables missing: %w", idemkit.ErrNotMigrated)

// fail wraps err for op, marking a schema that is not migrated.
func fail(op string, err error) error {
	return fmt.Errorf("dedup: %s: %w", op, pgexec.NotMigrated(ErrNotMigrated, err))
}
