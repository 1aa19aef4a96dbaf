-- 016_position_claims_ahead: positions no longer say whether claims lie
-- past them. Stop the runners first: a runner of this version writes the
-- column. A position that lagged its claims then makes the next runner
-- report those messages as duplicates once; nothing is applied twice.
ALTER TABLE {{.ConsumerPositions}}
    DROP COLUMN claims_ahead;
