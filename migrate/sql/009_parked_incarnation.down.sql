-- Reverting fails, and changes nothing, while messages of two incarnations
-- are parked at the same coordinates: dropping one would lose it.

DROP INDEX {{.Schema}}.{{.Index "ParkedMessages" "_key_idx"}};

ALTER TABLE {{.ParkedMessages}} RENAME TO {{.Index "ParkedMessages" "_v9"}};

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
    CONSTRAINT {{.Index "ParkedMessages" "_pkey8"}}
        PRIMARY KEY (consumer, topic, kafka_partition, kafka_offset)
);

INSERT INTO {{.ParkedMessages}} (consumer, topic, kafka_partition, kafka_offset, message_key, message_id, value,
        headers, message_time, attempts, first_failed_at, last_failed_at, last_error, next_attempt_at, parked_at)
    SELECT consumer, topic, kafka_partition, kafka_offset, message_key, message_id, value,
        headers, message_time, attempts, first_failed_at, last_failed_at, last_error, next_attempt_at, parked_at
    FROM {{.Schema}}.{{.Index "ParkedMessages" "_v9"}};

DROP TABLE {{.Schema}}.{{.Index "ParkedMessages" "_v9"}};

ALTER TABLE {{.ParkedMessages}} RENAME CONSTRAINT {{.Index "ParkedMessages" "_pkey8"}} TO {{.Index "ParkedMessages" "_pkey"}};

CREATE INDEX {{.Index "ParkedMessages" "_key_idx"}}
    ON {{.ParkedMessages}} (consumer, topic, kafka_partition, message_key, kafka_offset);
