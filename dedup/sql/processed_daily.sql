-- processed_daily: whether consumer $1 claimed the UUIDv7 $2 of day $3 in
-- the daily table.
SELECT EXISTS (SELECT 1 FROM {{daily}} WHERE consumer = $1 AND message_uuid = $2 AND day = $3)
