-- purge: deletes up to $2 claims of the flat table made before $1, oldest
-- first, skipping rows a concurrent purge holds. Rows are found by their
-- ctid: a row has one of two keys.
DELETE FROM {{processed}} WHERE ctid = ANY (ARRAY (
	SELECT ctid FROM {{processed}}
	WHERE processed_at < $1
	ORDER BY processed_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))
