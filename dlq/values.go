package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/migrate"
)

// HeaderValueStored marks a dead letter whose original value was too large
// for its dead-letter topic: the letter's own value is empty, and the
// original lives in PostgreSQL (see WriterConfig.Pool). It reads
// "<size> sha256:<hex>", the reference LoadValue finds and checks it by.
const HeaderValueStored = "idemkit-dlq-value-stored"

// ValueRef is the reference a dead letter carries in HeaderValueStored.
type ValueRef struct {
	Size   int
	SHA256 [sha256.Size]byte
}

func refOf(value []byte) ValueRef { return ValueRef{Size: len(value), SHA256: sha256.Sum256(value)} }

func (r ValueRef) String() string {
	return strconv.Itoa(r.Size) + " sha256:" + hex.EncodeToString(r.SHA256[:])
}

func parseValueRef(s string) (ValueRef, error) {
	size, sum, ok := strings.Cut(s, " sha256:")
	n, err := strconv.Atoi(size)
	b, herr := hex.DecodeString(sum)
	if !ok || err != nil || n < 0 || herr != nil || len(b) != sha256.Size {
		return ValueRef{}, fmt.Errorf("want \"<size> sha256:<64 hex digits>\", got %q", s)
	}
	r := ValueRef{Size: n}
	copy(r.SHA256[:], b)
	return r, nil
}

// ErrValueNotFound means a dead letter references a stored value (see
// HeaderValueStored) that its table does not hold, or holds with other
// bytes: the letter is left alone.
var ErrValueNotFound = errors.New("dlq: stored value not found")

// dbtx runs a query on a pool or a transaction.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// valueStore is the table of values too large for their dead-letter topic
// (migrate.Tables.DLQValues).
type valueStore struct {
	table string // quoted
}

func newValueStore(tables migrate.Tables) (*valueStore, error) {
	c := tables.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &valueStore{table: pgx.Identifier{c.Schema, c.DLQValues}.Sanitize()}, nil
}

// put stores value for the letters of the consumer name's message from o;
// a value already stored is a result, not an error.
func (s *valueStore) put(ctx context.Context, db dbtx, name string, o Origin, value []byte) (ValueRef, error) {
	ref := refOf(value)
	_, err := db.Exec(ctx, `INSERT INTO `+s.table+` (consumer, origin_topic, origin_incarnation, origin_partition,
		origin_offset, value_sha256, value) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`,
		name, o.Topic, o.Incarnation, o.Partition, o.Offset, ref.SHA256[:], value)
	if err != nil {
		return ValueRef{}, fmt.Errorf("store value of %s/%d/%d: %w", o.Topic, o.Partition, o.Offset, err)
	}
	return ref, nil
}

// get returns the value d references, checked against its size and hash.
func (s *valueStore) get(ctx context.Context, db dbtx, d *DeadLetter) ([]byte, error) {
	ref, o := d.StoredValue, d.Origin
	var v []byte
	err := db.QueryRow(ctx, `SELECT value FROM `+s.table+` WHERE consumer = $1 AND origin_topic = $2
		AND origin_incarnation = $3 AND origin_partition = $4 AND origin_offset = $5 AND value_sha256 = $6`,
		d.Consumer, o.Topic, o.Incarnation, o.Partition, o.Offset, ref.SHA256[:]).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && refOf(v) != *ref {
		return nil, fmt.Errorf("%w: %s/%d/%d of %s (%s)", ErrValueNotFound, o.Topic, o.Partition, o.Offset, d.Consumer, ref)
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: load value of %s/%d/%d: %w", o.Topic, o.Partition, o.Offset, err)
	}
	return v, nil
}

// LoadValue puts the original value of a dead letter that references a
// stored one (d.StoredValue set) into d.Message.Value, from the table
// cfg names (migrate.Tables.DLQValues) in pool, checked against the
// reference's size and SHA-256; d.Original then returns the original bytes.
// A letter without a stored value is left as is. A value that is missing or
// differs is an error matching ErrValueNotFound.
func LoadValue(ctx context.Context, pool *pgxpool.Pool, tables migrate.Tables, d *DeadLetter) error {
	if d.StoredValue == nil || d.valueLoaded {
		return nil
	}
	if pool == nil {
		return fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	s, err := newValueStore(tables)
	if err != nil {
		return err
	}
	return s.load(ctx, pool, d)
}

func (s *valueStore) load(ctx context.Context, db dbtx, d *DeadLetter) error {
	if d.StoredValue == nil || d.valueLoaded {
		return nil
	}
	v, err := s.get(ctx, db, d)
	if err != nil {
		return err
	}
	d.Message.Value, d.valueLoaded = v, true
	return nil
}
