-- 007_dlq_incarnation: dead-letter replay records gain the origin topic's
-- incarnation (see 006 and consumer.Message.Incarnation), as part of their
-- key: once a topic was deleted and created again its offsets start over,
-- and a dead letter of the new incarnation must not look replayed because
-- one of the old incarnation had the same coordinates. Existing records
-- belong to incarnation 0.
--
-- The table is rebuilt rather than altered, so that the new column sits
-- with the other origin columns and the primary key can be replaced without
-- knowing the name PostgreSQL gave the old one (table names are free-form).

ALTER TABLE {{.DLQReplays}} RENAME TO {{.Index "DLQReplays" "_v6"}};

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
    CONSTRAINT {{.Index "DLQReplays" "_pkey7"}}
        PRIMARY KEY (origin_topic, origin_incarnation, origin_partition, origin_offset, replay_round)
);

INSERT INTO {{.DLQReplays}} (origin_topic, origin_partition, origin_offset, replay_round, dead_letter_topic,
        message_id, consumer, outcome, detail, replayed_by, replayed_at)
    SELECT origin_topic, origin_partition, origin_offset, replay_round, dead_letter_topic,
        message_id, consumer, outcome, detail, replayed_by, replayed_at
    FROM {{.Schema}}.{{.Index "DLQReplays" "_v6"}};

DROP TABLE {{.Schema}}.{{.Index "DLQReplays" "_v6"}};

ALTER TABLE {{.DLQReplays}} RENAME CONSTRAINT {{.Index "DLQReplays" "_pkey7"}} TO {{.Index "DLQReplays" "_pkey"}};
