-- 015_dedup_daily: the optional daily-partitioned dedup layout (issue 13).
--
-- Nothing here changes how claims are stored until the layout is enabled
-- (dedup.Store.EnableDaily, `idemkit dedup daily enable`): this version only
-- adds what that needs, empty.
--
-- - A function that reads the day (UTC) out of a UUIDv7 (RFC 9562: version
--   7, variant 10; the first 48 bits are milliseconds since the Unix epoch),
--   NULL for any other UUID. It is IMMUTABLE: the day of an ID never
--   changes, which is what lets a claim find its row again on every
--   redelivery.
-- - The daily table: partitioned by range of that day, one partition per day
--   (created ahead and dropped behind by dedup.Store.MaintainPartitions).
--   Its primary key includes the day, as PostgreSQL requires of a unique
--   index on a partitioned table; since the day is a function of the ID
--   (the CHECK enforces it), (consumer, message_uuid) is unique as well, and
--   a claim stays one INSERT … ON CONFLICT DO NOTHING.
-- - The layout row: NULL daily_from means every claim is stored in the
--   processed-messages table as before.
--
-- Binaries of earlier versions keep working after this version: it changes
-- no existing table. Once the daily layout is enabled, their claims of
-- UUIDv7 IDs it moves fail (the flat table's CHECK refuses them) instead of
-- escaping dedup: upgrade them before enabling it.
CREATE FUNCTION {{.Schema}}.{{.Index "ProcessedMessages" "_uuid7_day"}}(id uuid) RETURNS date
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE WHEN substr(id::text, 15, 1) = '7' AND substr(id::text, 20, 1) IN ('8', '9', 'a', 'b')
        THEN (timestamp '1970-01-01 00:00:00'
            + ('x' || substr(id::text, 1, 8) || substr(id::text, 10, 4))::bit(48)::bigint * interval '1 millisecond')::date
    END;

CREATE TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_daily"}} (
    consumer        text        NOT NULL,
    message_uuid    uuid        NOT NULL,
    day             date        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL CHECK (kafka_partition >= 0),
    kafka_offset    bigint      NOT NULL CHECK (kafka_offset >= 0),
    processed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_uuid, day),
    CONSTRAINT {{.Index "ProcessedMessages" "_daily_day"}}
        CHECK (day = {{.Schema}}.{{.Index "ProcessedMessages" "_uuid7_day"}}(message_uuid))
) PARTITION BY RANGE (day);

-- One row. daily_from: the first day (of UUIDv7 time) whose IDs are stored
-- in the daily table; NULL while the layout is flat. daily_ready: false
-- while dedup.Store.EnableDaily is still switching (claims then stay in the
-- flat table, and those the switch would move fail and are retried).
-- keep_days: how many days of partitions MaintainPartitions keeps behind
-- today (NULL: it drops none). ahead_days: how many days it creates ahead.
CREATE TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}} (
    one_row     boolean     PRIMARY KEY DEFAULT true CHECK (one_row),
    daily_from  date,
    daily_ready boolean     NOT NULL DEFAULT false,
    keep_days   int         CHECK (keep_days > 0),
    ahead_days  int         NOT NULL DEFAULT 3 CHECK (ahead_days BETWEEN 1 AND 366),
    changed_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}} DEFAULT VALUES;
