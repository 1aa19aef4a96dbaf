-- 001_dedup: the dedup store's tables.
--
-- Identifiers are filled in by migrate with already-quoted names; values are
-- never templated.

-- One row per claimed (consumer, message ID): written in the consumer's
-- transaction together with the handler's effects.
CREATE TABLE {{.ProcessedMessages}} (
    consumer        text        NOT NULL,
    message_id      text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
    kafka_offset    bigint      NOT NULL CHECK (kafka_offset >= 0),
    processed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Retention purges delete by age in bounded batches.
CREATE INDEX {{.ProcessedMessagesProcessedAtIndex}} ON {{.ProcessedMessages}} (processed_at);

-- The consumer's next offset per partition, written in the same transaction
-- as the effects of the message at next_offset - 1.
CREATE TABLE {{.ConsumerPositions}} (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
    next_offset     bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, kafka_partition)
);
