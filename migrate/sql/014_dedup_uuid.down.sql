-- 014_dedup_uuid: back to one text key. Every row stored by UUID is
-- rewritten with its text (the whole table's share of such rows), then the
-- primary key is built again: on a large table this takes as long as the
-- rewrite and the index build, and blocks writes meanwhile.
ALTER TABLE {{.ProcessedMessages}} DROP CONSTRAINT {{.Index "ProcessedMessages" "_one_id"}};
UPDATE {{.ProcessedMessages}} SET message_id = message_uuid::text WHERE message_id IS NULL;
DROP INDEX {{.Schema}}.{{.Index "ProcessedMessages" "_uuid_key"}};
ALTER TABLE {{.ProcessedMessages}}
    DROP COLUMN message_uuid,
    ALTER COLUMN message_id SET NOT NULL,
    ADD PRIMARY KEY (consumer, message_id);
DROP INDEX {{.Schema}}.{{.Index "ProcessedMessages" "_id_key"}};
