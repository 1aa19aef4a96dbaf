-- lock_positions: list_positions, locking the rows for a seek.
SELECT {{template "position_columns"}} FROM {{positions}}
WHERE consumer = $1 AND topic = $2 ORDER BY kafka_partition FOR UPDATE
