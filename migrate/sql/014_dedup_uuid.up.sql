-- 014_dedup_uuid: a message ID that is a canonical UUID is stored as uuid
-- (issue 13).
--
-- A claim of an ID in the canonical form of a UUID (36 characters, lower
-- case hex and hyphens, as uuid::text prints it) writes it to message_uuid
-- (16 bytes) and leaves message_id NULL; any other ID is stored as text in
-- message_id, as before. Exactly one of the two is set on a row written
-- since this version (the CHECK, NOT VALID: rows written before are not
-- scanned). The primary key on (consumer, message_id) becomes two partial
-- unique indexes, one per column; a claim stays one INSERT … ON CONFLICT DO
-- NOTHING, whose arbiters are both.
--
-- Rows written before this version keep their UUIDs as text: a claim of a
-- UUID also looks for such a row (dedup.Store), so nothing claimed before
-- the upgrade is applied again, and no row is rewritten here. Old rows
-- leave as retention purges them.
--
-- Cost on a large table: adding the column and dropping NOT NULL change
-- the catalog only; dropping the primary key drops its index. Building
-- the text index reads and sorts the whole table and blocks writes to it
-- meanwhile (about as long as building the old primary key: see
-- scripts/bench-dedup), and the uuid index reads it once more. To keep
-- writes flowing, add the column (ALTER TABLE … ADD COLUMN message_uuid
-- uuid: the catalog only) and build both indexes first, with the names and
-- definitions below, using CREATE UNIQUE INDEX CONCURRENTLY: this migration
-- then finds them and changes the catalog only. An index of that name left INVALID by a
-- failed concurrent build fails the migration (drop it and build it again).
--
-- Binaries of earlier versions name (consumer, message_id) as their
-- conflict target, which no longer matches a unique index: their claims
-- fail (they never write a row that would escape dedup). Stop them before
-- migrating, or accept that they stop until upgraded.
ALTER TABLE {{.ProcessedMessages}} ADD COLUMN IF NOT EXISTS message_uuid uuid;

CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "ProcessedMessages" "_id_key"}}
    ON {{.ProcessedMessages}} (consumer, message_id) WHERE message_id IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "ProcessedMessages" "_uuid_key"}}
    ON {{.ProcessedMessages}} (consumer, message_uuid) WHERE message_uuid IS NOT NULL;

DO $$
DECLARE
    pm regclass := {{.Literal .ProcessedMessages}}::regclass;
    pkey name;
    invalid text;
BEGIN
    SELECT string_agg(c.relname, ', ') INTO invalid
    FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
    WHERE i.indrelid = pm AND NOT i.indisvalid;
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'idemkit migration 14: invalid index(es) on %: % (a failed CREATE INDEX CONCURRENTLY?): drop and build again', pm, invalid;
    END IF;
    SELECT conname INTO pkey FROM pg_constraint WHERE conrelid = pm AND contype = 'p';
    IF pkey IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', pm, pkey);
    END IF;
END
$$;

ALTER TABLE {{.ProcessedMessages}}
    ALTER COLUMN message_id DROP NOT NULL,
    ADD CONSTRAINT {{.Index "ProcessedMessages" "_one_id"}}
        CHECK ((message_id IS NULL) <> (message_uuid IS NULL)) NOT VALID;
