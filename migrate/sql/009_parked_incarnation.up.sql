-- 009_parked_incarnation: parked messages gain the topic's incarnation (see
-- 006 and consumer.Message.Incarnation), as part of their key: once a topic
-- was deleted and created again its offsets start over, and a message of the
-- new incarnation parked behind its key must not collide with a message of
-- the old one still parked at the same offset. Existing rows belong to
-- incarnation 0. A key's parked messages are released in (incarnation,
-- offset) order.
--
-- The table is rebuilt rather than altered, so that the primary key can be
-- replaced without knowing the name PostgreSQL gave the old one (table names
-- are free-form).

DROP INDEX {{.Schema}}.{{.Index "ParkedMessages" "_key_idx"}};

ALTER TABLE {{.ParkedMessages}} RENAME TO {{.Index "ParkedMessages" "_v8"}};

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
    CONSTRAINT {{.Index "ParkedMessages" "_pkey9"}}
        PRIMARY KEY (consumer, topic, kafka_partition, incarnation, kafka_offset)
);

INSERT INTO {{.ParkedMessages}} (consumer, topic, kafka_partition, kafka_offset, message_key, message_id, value,
        headers, message_time, attempts, first_failed_at, last_failed_at, last_error, next_attempt_at, parked_at)
    SELECT consumer, topic, kafka_partition, kafka_offset, message_key, message_id, value,
        headers, message_time, attempts, first_failed_at, last_failed_at, last_error, next_attempt_at, parked_at
    FROM {{.Schema}}.{{.Index "ParkedMessages" "_v8"}};

DROP TABLE {{.Schema}}.{{.Index "ParkedMessages" "_v8"}};

ALTER TABLE {{.ParkedMessages}} RENAME CONSTRAINT {{.Index "ParkedMessages" "_pkey9"}} TO {{.Index "ParkedMessages" "_pkey"}};

CREATE INDEX {{.Index "ParkedMessages" "_key_idx"}}
    ON {{.ParkedMessages}} (consumer, topic, kafka_partition, message_key, incarnation, kafka_offset);
