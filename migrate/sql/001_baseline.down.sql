-- 001_baseline: drops every idemkit table, with its rows (the daily
-- layout's partitions go with their table).
DROP TABLE {{.ConsoleAudit}};
DROP TABLE {{.DLQValues}};
DROP TABLE {{.DLQReplays}};
DROP TABLE {{.IdempotencyRecords}};
DROP TABLE {{.Outbox}};
DROP TABLE {{.ParkedMessages}};
DROP TABLE {{.ConsumerPositions}};
DROP TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}};
DROP TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_daily"}};
DROP TABLE {{.ProcessedMessages}};
