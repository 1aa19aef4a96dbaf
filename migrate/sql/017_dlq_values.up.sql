-- 017_dlq_values: original values of dead letters too large for their
-- dead-letter topic. The letter then carries the original key and headers,
-- the dead-letter headers and a reference (its value's size and SHA-256);
-- the value lives here, one row per consumer, origin message and value, so
-- that writing the same letter again (a retry, a later replay round) finds
-- the row it needs and stores nothing twice. Readers (dlq.Reprocessor,
-- idemkit dlq inspect and replay) load it by that reference and check it.
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
