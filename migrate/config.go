package migrate

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idemkit"
)

// Defaults of Config.
const (
	// SchemaDefault is the schema of every idemkit table.
	SchemaDefault = "public"
	// ProcessedMessagesDefault is the table of claimed message IDs.
	ProcessedMessagesDefault = "processed_messages"
	// ConsumerPositionsDefault is the table of next offsets per partition.
	ConsumerPositionsDefault = "consumer_positions"
	// MigrationsDefault is the bookkeeping table of applied versions.
	MigrationsDefault = "idemkit_migrations"
	// OutboxDefault is the table of outbox messages (package outbox).
	OutboxDefault = "idemkit_outbox"
	// IdempotencyRecordsDefault is the table of HTTP idempotency records
	// (package idemhttp).
	IdempotencyRecordsDefault = "idempotency_records"
	// ParkedMessagesDefault is the table of messages parked by the
	// consumer's non-blocking retry mode.
	ParkedMessagesDefault = "idemkit_parked_messages"
	// DLQReplaysDefault is the table of dead-letter replays (package dlq).
	DLQReplaysDefault = "idemkit_dlq_replays"
	// DLQValuesDefault is the table of dead-letter values too large for
	// their dead-letter topic (package dlq).
	DLQValuesDefault = "idemkit_dlq_values"
)

// MaxIdentifierLength is the longest PostgreSQL identifier, in bytes
// (NAMEDATALEN - 1). Longer names would be silently truncated by the server,
// so Validate rejects them.
const MaxIdentifierLength = 63

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = fmt.Errorf("migrate: %w", idemkit.ErrInvalidConfig)

// Tables names idemkit's tables, unqualified. Any string PostgreSQL accepts
// as a quoted identifier is allowed: names are quoted, never interpolated raw.
type Tables struct {
	// ProcessedMessages holds one row per claimed (consumer, message ID).
	// Defaults to "processed_messages".
	ProcessedMessages string
	// ConsumerPositions holds each consumer's next offset per partition.
	// Defaults to "consumer_positions".
	ConsumerPositions string
	// Migrations records which migration versions are applied.
	// Defaults to "idemkit_migrations".
	Migrations string
	// Outbox holds messages enqueued in business transactions.
	// Defaults to "idemkit_outbox".
	Outbox string
	// IdempotencyRecords holds the HTTP middleware's records.
	// Defaults to "idempotency_records".
	IdempotencyRecords string
	// ParkedMessages holds messages parked by the consumer's non-blocking
	// retry mode. Defaults to "idemkit_parked_messages".
	ParkedMessages string
	// DLQReplays records which dead letters were replayed, by whom and how.
	// Defaults to "idemkit_dlq_replays".
	DLQReplays string
	// DLQValues holds the original values of dead letters too large for
	// their dead-letter topic. Defaults to "idemkit_dlq_values".
	DLQValues string
}

// Config says where idemkit's tables live.
type Config struct {
	// Schema holds every idemkit table; Up creates it when missing.
	// Defaults to "public".
	Schema string
	// Tables names the tables inside Schema. Each name defaults as documented
	// on Tables.
	Tables Tables
	// Logger receives a Warn when Up starts waiting for a server that cannot
	// be reached or is starting, and an Info when the server answers again.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every empty field set to its default.
func (c Config) WithDefaults() Config {
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.Tables.ProcessedMessages = cmp.Or(c.Tables.ProcessedMessages, ProcessedMessagesDefault)
	c.Tables.ConsumerPositions = cmp.Or(c.Tables.ConsumerPositions, ConsumerPositionsDefault)
	c.Tables.Migrations = cmp.Or(c.Tables.Migrations, MigrationsDefault)
	c.Tables.Outbox = cmp.Or(c.Tables.Outbox, OutboxDefault)
	c.Tables.IdempotencyRecords = cmp.Or(c.Tables.IdempotencyRecords, IdempotencyRecordsDefault)
	c.Tables.ParkedMessages = cmp.Or(c.Tables.ParkedMessages, ParkedMessagesDefault)
	c.Tables.DLQReplays = cmp.Or(c.Tables.DLQReplays, DLQReplaysDefault)
	c.Tables.DLQValues = cmp.Or(c.Tables.DLQValues, DLQValuesDefault)
	return c
}

// Validate reports whether c, with defaults applied, names usable
// identifiers: each non-empty, at most MaxIdentifierLength bytes, valid UTF-8
// without NUL, and the tables distinct. The error wraps
// ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.WithDefaults()
	fields := []struct{ name, value string }{
		{"Schema", c.Schema},
		{"Tables.ProcessedMessages", c.Tables.ProcessedMessages},
		{"Tables.ConsumerPositions", c.Tables.ConsumerPositions},
		{"Tables.Migrations", c.Tables.Migrations},
		{"Tables.Outbox", c.Tables.Outbox},
		{"Tables.IdempotencyRecords", c.Tables.IdempotencyRecords},
		{"Tables.ParkedMessages", c.Tables.ParkedMessages},
		{"Tables.DLQReplays", c.Tables.DLQReplays},
		{"Tables.DLQValues", c.Tables.DLQValues},
	}
	seen := map[string]string{}
	for i, f := range fields {
		if err := validateIdentifier(f.value); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalidConfig, f.name, err)
		}
		if i == 0 {
			continue // the schema may share a table's name
		}
		if other, ok := seen[f.value]; ok {
			return fmt.Errorf("%w: %s and %s both name %q: table names must be distinct", ErrInvalidConfig, other, f.name, f.value)
		}
		seen[f.value] = f.name
	}
	return nil
}

func validateIdentifier(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > MaxIdentifierLength:
		return fmt.Errorf("%d bytes, longer than %d", len(s), MaxIdentifierLength)
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains NUL")
	}
	return nil
}
