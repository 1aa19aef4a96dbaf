-- Back to replay records keyed by coordinates alone. When records of two
-- incarnations share coordinates, version 6 cannot keep both: the insert
-- fails with a unique violation and nothing is reverted (delete the records
-- you can spare first). Records are never dropped silently: a dead letter
-- whose record went missing would be replayed again.

ALTER TABLE {{.DLQReplays}} RENAME TO {{.Index "DLQReplays" "_v7"}};

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
    CONSTRAINT {{.Index "DLQReplays" "_pkey6"}}
        PRIMARY KEY (origin_topic, origin_partition, origin_offset, replay_round)
);

INSERT INTO {{.DLQReplays}} (origin_topic, origin_partition, origin_offset, replay_round, dead_letter_topic,
        message_id, consumer, outcome, detail, replayed_by, replayed_at)
    SELECT origin_topic, origin_partition, origin_offset, replay_round, dead_letter_topic,
        message_id, consumer, outcome, detail, replayed_by, replayed_at
    FROM {{.Schema}}.{{.Index "DLQReplays" "_v7"}};

DROP TABLE {{.Schema}}.{{.Index "DLQReplays" "_v7"}};

ALTER TABLE {{.DLQReplays}} RENAME CONSTRAINT {{.Index "DLQReplays" "_pkey6"}} TO {{.Index "DLQReplays" "_pkey"}};
