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

// Defaults of Tables.
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
	// ConsoleAuditDefault is the table of the actions taken in the web
	// console (module console/).
	ConsoleAuditDefault = "idemkit_console_audit"
)

// MaxIdentifierLength is the longest PostgreSQL identifier, in bytes
// (NAMEDATALEN - 1). Longer names would be silently truncated by the server,
// so Validate rejects them.
const MaxIdentifierLength = 63

// ErrInvalidConfig is wrapped by every error Tables.Validate returns.
var ErrInvalidConfig = fmt.Errorf("migrate: %w", idemkit.ErrInvalidConfig)

// Tables says where idemkit's tables live: the schema and each table's
// name inside it. It is the one value every package that touches the tables
// takes (migrate.Config, dedup.Config, outbox.Config, idemhttp.StoreConfig,
// the dlq configs, monitor.Config): say it once, pass it everywhere. Any
// string PostgreSQL accepts as a quoted identifier is allowed: names are
// quoted, never interpolated raw. The zero value means every default.
type Tables struct {
	// Schema holds every idemkit table; Up creates it when missing.
	// Defaults to "public".
	Schema string
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
	// ConsoleAudit records the actions taken in the web console (module
	// console/): who, when, what, from which address, the outcome. Defaults
	// to "idemkit_console_audit".
	ConsoleAudit string
}

// Config configures a Migrator.
type Config struct {
	// Tables says where the tables live (the zero value: every default).
	Tables Tables
	// Logger receives a Warn when Up starts waiting for a server that cannot
	// be reached or is starting, and an Info when the server answers again.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of t with every empty field set to its default.
func (t Tables) WithDefaults() Tables {
	t.Schema = cmp.Or(t.Schema, SchemaDefault)
	t.ProcessedMessages = cmp.Or(t.ProcessedMessages, ProcessedMessagesDefault)
	t.ConsumerPositions = cmp.Or(t.ConsumerPositions, ConsumerPositionsDefault)
	t.Migrations = cmp.Or(t.Migrations, MigrationsDefault)
	t.Outbox = cmp.Or(t.Outbox, OutboxDefault)
	t.IdempotencyRecords = cmp.Or(t.IdempotencyRecords, IdempotencyRecordsDefault)
	t.ParkedMessages = cmp.Or(t.ParkedMessages, ParkedMessagesDefault)
	t.DLQReplays = cmp.Or(t.DLQReplays, DLQReplaysDefault)
	t.DLQValues = cmp.Or(t.DLQValues, DLQValuesDefault)
	t.ConsoleAudit = cmp.Or(t.ConsoleAudit, ConsoleAuditDefault)
	return t
}

// Validate reports whether t, with defaults applied, names usable
// identifiers: each non-empty, at most MaxIdentifierLength bytes, valid UTF-8
// without NUL, and the tables distinct. The error wraps ErrInvalidConfig.
func (t Tables) Validate() error {
	t = t.WithDefaults()
	fields := []struct{ name, value string }{
		{"Schema", t.Schema},
		{"ProcessedMessages", t.ProcessedMessages},
		{"ConsumerPositions", t.ConsumerPositions},
		{"Migrations", t.Migrations},
		{"Outbox", t.Outbox},
		{"IdempotencyRecords", t.IdempotencyRecords},
		{"ParkedMessages", t.ParkedMessages},
		{"DLQReplays", t.DLQReplays},
		{"DLQValues", t.DLQValues},
		{"ConsoleAudit", t.ConsoleAudit},
	}
	seen := map[string]string{}
	for i, f := range fields {
		if err := validateIdentifier(f.value); err != nil {
			return fmt.Errorf("%w: Tables.%s: %v", ErrInvalidConfig, f.name, err)
		}
		if i == 0 {
			continue // the schema may share a table's name
		}
		if other, ok := seen[f.value]; ok {
			return fmt.Errorf("%w: Tables.%s and Tables.%s both name %q: table names must be distinct", ErrInvalidConfig, other, f.name, f.value)
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
