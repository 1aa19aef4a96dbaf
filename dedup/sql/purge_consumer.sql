-- purge_consumer: purge limited to consumer $1 ($2 the cutoff, $3 the
-- limit).
DELETE FROM {{processed}} WHERE ctid = ANY (ARRAY (
	SELECT ctid FROM {{processed}}
	WHERE consumer = $1 AND processed_at < $2
	ORDER BY processed_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED
))
