-- 015_dedup_daily: the optional daily-partitioned dedup layout (issue 13).
--
-- Nothing here changes how claims are stored until the layout is enabled
-- (dedup.Store.EnableDaily, `idemkit dedup daily enable`): this version only
-- adds what that needs, empty.
--
-- - The daily table: partitioned by range of day, the UTC day of the ID's
--   UUIDv7 timestamp (RFC 9562: version 7, variant 10, the first 48 bits
--   milliseconds since the Unix epoch), which dedup.Store reads out of the
--   ID, so that one ID always has one day; one partition per day, created
--   ahead and dropped behind by dedup.Store.MaintainPartitions. Its primary
--   key includes the day, as PostgreSQL requires of a unique index on a
--   partitioned table; since the day is a function of the ID,
--   (consumer, message_uuid) is unique as well, and a claim stays one
--   INSERT … ON CONFLICT DO NOTHING. (No CHECK restates that function here:
--   preparing one costs every single-row insert more than the insert.)
-- - The layout row: NULL daily_from means every claim is stored in the
--   processed-messages table as before.
--
-- Binaries of earlier versions keep working after this version: it changes
-- no existing table. Once the daily layout is enabled, their claims of
-- UUIDv7 IDs it moves fail (the flat table's CHECK refuses them) instead of
-- escaping dedup: upgrade them before enabling it.
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

-- One row. daily_from: the first day (of UUIDv7 time) whose IDs are stored
-- in the daily table; NULL while the layout is flat. daily_ready: false
-- while the switch is in progress (claims then stay in the flat table, and
-- those the switch would move fail and are retried). keep_days: how many
-- days of partitions MaintainPartitions keeps behind today (NULL: it drops
-- none). ahead_days: how many days it creates ahead. dropped_before: the
-- retention's watermark, raised before a day is dropped; no day before it
-- is ever created again.
CREATE TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}} (
    one_row     boolean     PRIMARY KEY DEFAULT true CHECK (one_row),
    daily_from  date,
    daily_ready boolean     NOT NULL DEFAULT false,
    keep_days   int         CHECK (keep_days > 0),
    ahead_days  int         NOT NULL DEFAULT 3 CHECK (ahead_days BETWEEN 1 AND 366),
    dropped_before date,
    changed_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}} DEFAULT VALUES;

-- The flat table's autovacuum, per table. Retention deletes a steady share
-- of its rows every day (a thirtieth with 30 days kept); PostgreSQL's
-- default waits for dead rows to reach 20% of the table before vacuuming,
-- so about six days of deleted rows sit as bloat that new claims cannot
-- reuse, and each vacuum then has that many to clean at once. At 1% (and
-- at least 10,000 rows) every day's purge is vacuumed soon after it, and
-- new claims fill the space it freed (scripts/bench-dedup -churn measures
-- both). It only changes the table's settings: no rewrite, no lock that
-- claims wait for.
ALTER TABLE {{.ProcessedMessages}} SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 10000);

-- The positions table: a row per (consumer, topic, partition), updated by
-- every claim. An update is HOT (no index entry, its old version pruned
-- in place) only if the page has room for the new version; at the default
-- fillfactor (100) a page of positions fills up between two prunings and
-- 2 to 16% of the updates were not HOT (20,000 updates of 24 rows: the
-- table grew to 20–134 pages and its index to 7); at 50, 99.5–99.8% were
-- HOT and the table stayed at 4–6 pages. Only pages written from now on
-- are affected.
ALTER TABLE {{.ConsumerPositions}} SET (fillfactor = 50);
