-- 002_outbox: the outbox table of package outbox.
--
-- Identifiers are filled in by migrate with already-quoted names; values are
-- never templated.

-- One row per enqueued message, written in the business transaction.
-- seq is the order of enqueue (an identity, cache 1: it grows with time
-- across sessions); id is the stable message ID carried as the
-- "message-id" header. A row is pending while published_at and parked_at are
-- NULL; it is due once available_at (not-before time, then retry backoff) has
-- passed. lock_key is a 64-bit hash of (table, destination, key): the relay
-- takes a transaction-level advisory lock on it so that one relay at a time
-- publishes a given key, and publishes that key's rows in seq order.
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
    parked_at    timestamptz,
    blocked_by   uuid,
    published_at timestamptz
);

-- The relay's scan: pending rows in enqueue order.
CREATE INDEX {{.Index "Outbox" "_pending_idx"}} ON {{.Outbox}} (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- A key's unpublished rows in order: its head, and what is behind it.
CREATE INDEX {{.Index "Outbox" "_key_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL;

-- Retention deletes published rows by age in bounded batches.
CREATE INDEX {{.Index "Outbox" "_published_idx"}} ON {{.Outbox}} (published_at)
    WHERE published_at IS NOT NULL;

-- Parked rows, listed and retried by command.
CREATE INDEX {{.Index "Outbox" "_parked_idx"}} ON {{.Outbox}} (seq)
    WHERE parked_at IS NOT NULL;
