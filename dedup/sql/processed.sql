-- processed: whether consumer $1 claimed the ID, $2 as text or $3 as a
-- uuid (the other NULL), in the flat table.
SELECT EXISTS (SELECT 1 FROM {{processed}} WHERE consumer = $1 AND message_id = $2)
	OR EXISTS (SELECT 1 FROM {{processed}} WHERE consumer = $1 AND message_uuid = $3)
