-- save_position: moves the position ($1 consumer, $2 topic, $3 partition)
-- on to $4, anchored at $5, under epoch $6, inserting the row when there is
-- none.
WITH {{template "position" "VALUES ($1::text, $2::text, $3::int, $4::bigint, $5::timestamptz, $6::bigint)"}}
SELECT 1
