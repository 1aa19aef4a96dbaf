-- 017_dlq_values: dead letters that reference a stored value can no longer
-- be replayed once this table is gone: replay or export them first.
DROP TABLE {{.DLQValues}};
