-- 001_baseline: every idemkit table.
--
-- Identifiers are filled in by migrate with already-quoted names; values are
-- never templated. Each table group serves one package; a service that uses
-- only some packages leaves the other tables empty.

-- ── dedup and consumer ──────────────────────────────────────────────────

-- One row per claimed (consumer, message ID): written in the consumer's
-- transaction together with the handler's effects. An ID in the canonical
-- form of a UUID (36 characters, lower case hex and hyphens, as uuid::text
-- prints it) is stored in message_uuid (16 bytes); any other ID in
-- message_id. Exactly one of the two is set. A claim is one
-- INSERT … ON CONFLICT DO NOTHING whose arbiters are both unique indexes.
--
-- Retention deletes a steady share of the rows every day (a thirtieth with
-- 30 days kept); PostgreSQL's default autovacuum waits for dead rows to
-- reach 20% of a table, leaving days of deleted rows as bloat. At 1% (and
-- at least 10,000 rows) each day's purge is vacuumed soon after it, and new
-- claims fill the space it freed.
CREATE TABLE {{.ProcessedMessages}} (
    consumer        text        NOT NULL,
    message_id      text,
    message_uuid    uuid,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
    kafka_offset    bigint      NOT NULL CHECK (kafka_offset >= 0),
    processed_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{.Index "ProcessedMessages" "_one_id"}}
        CHECK ((message_id IS NULL) <> (message_uuid IS NULL))
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 10000);

CREATE UNIQUE INDEX {{.Index "ProcessedMessages" "_id_key"}}
    ON {{.ProcessedMessages}} (consumer, message_id) WHERE message_id IS NOT NULL;
CREATE UNIQUE INDEX {{.Index "ProcessedMessages" "_uuid_key"}}
    ON {{.ProcessedMessages}} (consumer, message_uuid) WHERE message_uuid IS NOT NULL;
-- Retention purges delete by age in bounded batches.
CREATE INDEX {{.ProcessedMessagesProcessedAtIndex}} ON {{.ProcessedMessages}} (processed_at);

-- The daily layout (dedup.Store.EnableDaily, `idemkit dedup daily
-- enable`), empty until enabled: UUIDv7 IDs stored by the UTC day of their
-- timestamp (RFC 9562: the first 48 bits are milliseconds since the Unix
-- epoch), one partition per day, created ahead and dropped behind by
-- dedup.Store.MaintainPartitions, so that retention drops a day instead of
-- deleting its rows. The primary key includes the day, as PostgreSQL
-- requires of a unique index on a partitioned table; since the day is a
-- function of the ID, (consumer, message_uuid) is unique as well.
CREATE TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_daily"}} (
    consumer        text        NOT NULL,
    message_uuid    uuid        NOT NULL,
    day             date        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
    kafka_offset    bigint      NOT NULL CHECK (kafka_offset >= 0),
    processed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_uuid, day)
) PARTITION BY RANGE (day);

-- The dedup layout, one row. daily_from: the first day (of UUIDv7 time)
-- whose IDs are stored in the daily table; NULL while the layout is flat.
-- daily_ready: false while a switch is in progress (claims then stay in the
-- flat table, and those the switch would move fail and are retried).
-- keep_days: the days of partitions MaintainPartitions keeps behind today
-- (NULL: it drops none). ahead_days: the days it creates ahead.
-- dropped_before: the retention's watermark, raised before a day is
-- dropped; no day before it is ever created again.
CREATE TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}} (
    one_row        boolean     PRIMARY KEY DEFAULT true CHECK (one_row),
    daily_from     date,
    daily_ready    boolean     NOT NULL DEFAULT false,
    keep_days      int         CHECK (keep_days > 0),
    ahead_days     int         NOT NULL DEFAULT 3 CHECK (ahead_days BETWEEN 1 AND 366),
    dropped_before date,
    changed_at     timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}} DEFAULT VALUES;

-- The consumer's next offset per partition, written in the same transaction
-- as the effects of the message at next_offset - 1. incarnation counts the
-- recreations of the topic the consumer passed; the anchor (anchor_offset,
-- anchor_time) is the record just before next_offset, read back at start to
-- tell a recreated topic; epoch counts the seeks of the position (a writer
-- that read an older epoch leaves it as it is).
--
-- Every claim updates its partition's row: at fillfactor 50 a page has
-- room for the new version, so the update is HOT (no index entry, the old
-- version pruned in place) and the table stays a few pages.
CREATE TABLE {{.ConsumerPositions}} (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
    next_offset     bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    incarnation     bigint      NOT NULL DEFAULT 0 CHECK (incarnation >= 0),
    anchor_time     timestamptz,
    anchor_offset   bigint      CHECK (anchor_offset >= 0),
    epoch           bigint      NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    PRIMARY KEY (consumer, topic, kafka_partition)
) WITH (fillfactor = 50);

-- Messages parked by the consumer's NonBlocking failure mode: each waits
-- for its next attempt, and the later messages of its key wait behind it.
CREATE TABLE {{.ParkedMessages}} (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
    incarnation     bigint      NOT NULL DEFAULT 0 CHECK (incarnation >= 0),
    kafka_offset    bigint      NOT NULL CHECK (kafka_offset >= 0),
    message_key     bytea       NOT NULL,
    message_id      text        NOT NULL,
    value           bytea,
    headers         jsonb       NOT NULL DEFAULT '[]',
    message_time    timestamptz,
    attempts        int         NOT NULL DEFAULT 0,
    first_failed_at timestamptz,
    last_failed_at  timestamptz,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    parked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, kafka_partition, incarnation, kafka_offset)
);
CREATE INDEX {{.Index "ParkedMessages" "_key_idx"}}
    ON {{.ParkedMessages}} (consumer, topic, kafka_partition, message_key, incarnation, kafka_offset);

-- ── outbox ──────────────────────────────────────────────────────────────

-- Messages enqueued in business transactions, published after commit in
-- seq order per lock_key. A row is ready (no earlier pending row of its key
-- holds it: blocked_by NULL; not waiting for a retry or dead: waiting
-- false), waiting, blocked by the row of its key before it, dead (given
-- up, kept until Store.Retry requeues it), or published. handler NOT NULL
-- marks a row for an in-process handler (the dispatcher) instead of Kafka.
CREATE TABLE {{.Outbox}} (
    seq          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           uuid        NOT NULL UNIQUE,
    handler      text,
    topic        text        NOT NULL,
    msg_key      bytea,
    value        bytea,
    headers      jsonb,
    lock_key     bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts     int         NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error   text,
    dead_at      timestamptz,
    blocked_by   uuid,
    published_at timestamptz,
    waiting      boolean     NOT NULL DEFAULT false
);
-- The relay's scan: ready Kafka rows in seq order.
CREATE INDEX {{.Index "Outbox" "_ready_idx"}} ON {{.Outbox}} (seq) INCLUDE (lock_key)
    WHERE published_at IS NULL AND blocked_by IS NULL AND dead_at IS NULL AND NOT waiting AND handler IS NULL;
-- Rows waiting for a retry, per key, and when the next falls due.
CREATE INDEX {{.Index "Outbox" "_waiting_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL AND blocked_by IS NULL AND waiting AND handler IS NULL;
CREATE INDEX {{.Index "Outbox" "_wake_idx"}} ON {{.Outbox}} (available_at)
    WHERE published_at IS NULL AND blocked_by IS NULL AND dead_at IS NULL AND waiting AND handler IS NULL;
-- The rows held behind a row, released when it is published.
CREATE INDEX {{.Index "Outbox" "_blocked_idx"}} ON {{.Outbox}} (blocked_by)
    WHERE blocked_by IS NOT NULL AND published_at IS NULL;
-- The dispatcher's scans: due handler rows, and the head of a key.
CREATE INDEX {{.Index "Outbox" "_handler_due_idx"}} ON {{.Outbox}} (handler, available_at, seq) INCLUDE (lock_key)
    WHERE published_at IS NULL AND dead_at IS NULL AND handler IS NOT NULL;
CREATE INDEX {{.Index "Outbox" "_key_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL AND blocked_by IS NULL AND handler IS NOT NULL;
-- Cleanup of published rows, and the dead listing.
CREATE INDEX {{.Index "Outbox" "_published_idx"}} ON {{.Outbox}} (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX {{.Index "Outbox" "_dead_idx"}} ON {{.Outbox}} (seq)
    WHERE dead_at IS NOT NULL;

-- ── idemhttp ────────────────────────────────────────────────────────────

-- One row per (account, operation, Idempotency-Key). A request's record is
-- updated in place as it completes: at fillfactor 70, with no index on the
-- columns it changes, those updates are HOT. Expired records are found by
-- a scan, not an index (an index on expires_at would make every update
-- non-HOT).
CREATE TABLE {{.IdempotencyRecords}} (
    account          text        NOT NULL,
    operation        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    state            text        NOT NULL
        CHECK (state IN ('PROCESSING', 'COMPLETED', 'FAILED', 'UNKNOWN')),
    token            bigint      NOT NULL,
    locked_until     timestamptz,
    response_status  int         CHECK (response_status BETWEEN 100 AND 999),
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (account, operation, idempotency_key),
    CHECK (state <> 'PROCESSING' OR locked_until IS NOT NULL),
    CHECK (state <> 'COMPLETED' OR response_status IS NOT NULL)
) WITH (fillfactor = 70);

-- ── dlq ─────────────────────────────────────────────────────────────────

-- One row per replay of a dead letter (round 0 for the first), keyed by its
-- origin's coordinates and the origin topic's incarnation: what was
-- replayed, by whom, and what came of it.
CREATE TABLE {{.DLQReplays}} (
    origin_topic       text        NOT NULL,
    origin_incarnation bigint      NOT NULL DEFAULT 0 CHECK (origin_incarnation >= 0),
    origin_partition   int         NOT NULL,
    origin_offset      bigint      NOT NULL,
    replay_round       int         NOT NULL,
    dead_letter_topic  text        NOT NULL,
    message_id         text        NOT NULL,
    consumer           text        NOT NULL,
    outcome            text        NOT NULL,
    detail             text,
    replayed_by        text        NOT NULL,
    replayed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (origin_topic, origin_incarnation, origin_partition, origin_offset, replay_round)
);

-- Original values of dead letters too large for their dead-letter topic.
-- The letter then carries the original key and headers, the dead-letter
-- headers and a reference (its value's size and SHA-256); the value lives
-- here, one row per consumer, origin message and value, so that writing the
-- same letter again (a retry, a later replay round) finds the row it needs
-- and stores nothing twice. Readers (dlq.Reprocessor, idemkit dlq inspect
-- and replay) load it by that reference and check it.
CREATE TABLE {{.DLQValues}} (
    consumer           text        NOT NULL,
    origin_topic       text        NOT NULL,
    origin_incarnation bigint      NOT NULL CHECK (origin_incarnation >= 0),
    origin_partition   int         NOT NULL CHECK (origin_partition >= 0),
    origin_offset      bigint      NOT NULL CHECK (origin_offset >= 0),
    value_sha256       bytea       NOT NULL CHECK (length(value_sha256) = 32),
    value              bytea       NOT NULL,
    stored_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, origin_topic, origin_incarnation, origin_partition, origin_offset, value_sha256)
);

-- ── console (optional: used only by the console/ module) ────────────────

-- One row per action taken in the web console: who (the principal its
-- Authorize returned), when, from which address, what (an action name and
-- its target), and the outcome. form_key is the nonce of the form that was
-- submitted: a form submitted twice inserts one row and acts once. A row
-- whose outcome stays 'started' is an action whose process ended before it
-- could record the end. Services without the console leave it empty.
CREATE TABLE {{.ConsoleAudit}} (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    principal   text        NOT NULL,
    remote_addr text        NOT NULL,
    action      text        NOT NULL,
    target      text        NOT NULL,
    form_key    text        NOT NULL UNIQUE,
    outcome     text        NOT NULL DEFAULT 'started' CHECK (outcome IN ('started', 'done', 'failed')),
    detail      text        NOT NULL DEFAULT '',
    finished_at timestamptz
);
CREATE INDEX {{.Index "ConsoleAudit" "_at_idx"}} ON {{.ConsoleAudit}} (at);
