-- 004_retry: tables of the consumer's non-blocking retry mode and of
-- dead-letter replays.

-- Messages parked by the non-blocking mode: a failing message, and every
-- later message of the same key behind it, written in the transaction that
-- lets the partition's position move on. Released in offset order per key.
CREATE TABLE {{.ParkedMessages}} (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
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
    PRIMARY KEY (consumer, topic, kafka_partition, kafka_offset)
);

CREATE INDEX {{.Index "ParkedMessages" "_key_idx"}}
    ON {{.ParkedMessages}} (consumer, topic, kafka_partition, message_key, kafka_offset);

-- One row per dead letter replayed (per replay round): who replayed it,
-- when, and what came of it. Replaying the same dead letter again finds its
-- row and does nothing.
CREATE TABLE {{.DLQReplays}} (
    origin_topic     text        NOT NULL,
    origin_partition int         NOT NULL,
    origin_offset    bigint      NOT NULL,
    replay_round     int         NOT NULL,
    dead_letter_topic text       NOT NULL,
    message_id       text        NOT NULL,
    consumer         text        NOT NULL,
    outcome          text        NOT NULL,
    detail           text,
    replayed_by      text        NOT NULL,
    replayed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (origin_topic, origin_partition, origin_offset, replay_round)
);
