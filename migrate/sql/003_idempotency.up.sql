-- 003_idempotency: the HTTP idempotency records of package idemhttp.
--
-- Identifiers are filled in by migrate with already-quoted names; values are
-- never templated.

-- One row per (account, operation, idempotency key). A request reserves its
-- key with INSERT … ON CONFLICT DO NOTHING (state PROCESSING, a lease and a
-- fresh token); the handler's transaction completes it (state COMPLETED and
-- the stored response) with an UPDATE that matches the token, so a holder
-- whose record was taken over cannot complete it. Only allow-listed response
-- headers are stored; request bodies and credentials never are: the request
-- is represented by its SHA-256 fingerprint.
CREATE TABLE {{.IdempotencyRecords}} (
    account          text        NOT NULL,
    operation        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    state            text        NOT NULL
        CHECK (state IN ('PROCESSING', 'COMPLETED', 'FAILED', 'UNKNOWN')),
    token            bigint      NOT NULL,
    locked_until     timestamptz,
    response_status  int         CHECK (response_status BETWEEN 100 AND 999),
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (account, operation, idempotency_key),
    CHECK (state <> 'PROCESSING' OR locked_until IS NOT NULL),
    CHECK (state <> 'COMPLETED' OR response_status IS NOT NULL)
);

-- Purges delete expired records in bounded batches.
CREATE INDEX {{.Index "IdempotencyRecords" "_expires_at_idx"}} ON {{.IdempotencyRecords}} (expires_at);

-- Records held past their lease are found for the reconciler.
CREATE INDEX {{.Index "IdempotencyRecords" "_stuck_idx"}} ON {{.IdempotencyRecords}} (locked_until)
    WHERE state = 'PROCESSING';
