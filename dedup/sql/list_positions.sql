-- list_positions: consumer $1's positions in topic $2, by partition.
SELECT {{template "position_columns"}} FROM {{positions}}
WHERE consumer = $1 AND topic = $2 ORDER BY kafka_partition
