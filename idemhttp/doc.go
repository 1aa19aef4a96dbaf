// Package idemhttp is an Idempotency-Key middleware for net/http handlers,
// with its records in PostgreSQL next to your business data.
//
// A client that does not know whether its POST happened (the response was
// lost) sends it again with the same Idempotency-Key; the handler's effect
// happens once and the client gets the first outcome.
//
// # Contract
//
// Scope. A record is keyed by (account, operation, key): the account from
// Config.Account (your authentication), the operation from the method and
// the route pattern (Config.Operation), the key from the Idempotency-Key
// header, or from where Config.Key takes it (KeyFromHeader, KeyFromJSON: a
// webhook provider's event ID; package webhook builds on this). Accounts
// never see each other's records; the same key on two operations is two
// keys. A replay skips the handler, and with it the
// handler's own permission checks: make the account identify the principal
// (the user or API client), not only the tenant, unless everyone in a
// tenant may see every response of the tenant.
//
// Holding a key, in transaction mode (the default). A request holds its
// key with a PostgreSQL advisory lock on it, taken in the transaction its
// handler runs in: one round trip sends BEGIN,
// pg_try_advisory_xact_lock(key) and the read of the record, in a statement
// that starts after the lock was granted and so sees whatever an earlier
// holder committed. Of concurrent requests with the key exactly one gets
// the lock; the others are answered at once (409, or the replay of a
// record already completed) without waiting on any row or index. The handler
// then writes its effects in that transaction (Tx returns it), on the one
// pooled connection the request uses until it is answered. After the
// handler returns, the middleware inserts the COMPLETED record with the
// stored response and commits, in one round trip: the business writes, the
// outbox messages and the record commit together or not at all. A first
// request so costs three round trips (the handler's statements aside) and
// writes its record once, with no UPDATE. While a request is in flight its
// key has no record; its holder also holds a lock on the key and its
// fingerprint, shared, and a request with another body, which can take
// that lock for its own fingerprint, so learns that it differs: 422 (after
// a few looks a few milliseconds apart, as a holder whose transaction ends
// frees the two locks one after the other). A holder whose process crashed holds
// nothing: PostgreSQL ends its session, rolls its transaction back and
// frees the lock, and the next request runs at once.
//
// Holding a key with a record of its own, with Config.NoTx or
// Config.NoLeaseTakeover. The first request reserves its key in one
// autocommit statement (INSERT … ON CONFLICT DO NOTHING, never
// SELECT-then-INSERT), as PROCESSING with a lease and a fresh random token,
// committed before the handler runs, so that a holder that crashed leaves a
// record for the reconciler. With NoLeaseTakeover the handler then runs in
// a transaction on the same connection, and the completion (an UPDATE that
// matches the token, a HOT update: it changes no indexed column) commits
// with it; with NoTx it runs without one and the record is completed by its
// own statement. If the token no longer matches (the reconciler settled the
// record, or it expired and another request took it), the completion fails:
// in a transaction it is rolled back and the client gets 409 lease_lost.
//
// The response is buffered and sent only after the commit, so a client never
// sees a success that was not committed.
//
// Fingerprint. Each request has a fingerprint: the HMAC-SHA256, keyed with
// a server-side secret (Config.FingerprintKeys, required and rotatable), of
// the operation, the request's method and path (as sent: the same key on
// /payments/1/refunds and /payments/2/refunds answers 422) and its intent
// (Config.Intent). Keyed, so that whoever reads the records (the table, a
// backup, Redis) but not the secret cannot test guesses of a request's
// content against them: a plain hash of a card number whose first six and
// last four digits are known falls to a hundred thousand guesses. By
// default the intent is the sorted query (a query that does not parse whole
// is refused), the media type and the canonical JSON of a JSON body
// (CanonicalJSON: key order, insignificant whitespace and number forms do
// not matter; members whose names differ only in case are refused), else
// the raw body; IntentJSON selects the members that
// define the intent. Headers, credentials and the body itself are never
// stored, only the keyed hash.
//
// Answers to a request whose key has a live record:
//
//   - other fingerprint: 422 idempotency_key_reused, nothing executed (this
//     check comes first, whatever the record's state);
//   - PROCESSING: 409 request_in_flight with Retry-After at once, or, with
//     Config.Wait, the answer once the first request finishes (see Waiting);
//     once its lease ended, in transaction mode, the request takes it over
//     and runs (see Leases);
//   - COMPLETED: the stored status, headers (those the allow-list,
//     Config.StoredHeaders, names at the replay) and body, with
//     Idempotent-Replayed: true;
//   - FAILED or UNKNOWN (set by a reconciler): 409 operation_failed or
//     outcome_unknown.
//
// Outcomes. A response whose status Config.Retryable accepts (by default
// 5xx, 408, 425, 429) is sent as it is while the transaction is rolled back
// and the key released (the record deleted): a retry runs the handler again.
// So are a handler panic (500 internal_error; the panic and its stack go to
// the Logger), an invalid status, and a response longer than
// Config.MaxResponseBytes (500 response_too_large: the middleware cannot
// store it, and it does not send what it could not commit). Every other
// response, definitive 4xx included, is stored and replayed. The
// transaction commits whenever a response is stored, so a handler that
// answers 4xx after writing must undo its writes (validate first, or use a
// savepoint: tx.Begin).
//
// Errors of the middleware itself are JSON: {"error":{"code":"...",
// "message":"..."}} with the stable codes of the Code constants: 400 for a
// missing or malformed key (empty, longer than 255 bytes, not printable
// ASCII), an invalid JSON body or an operation that cannot be stored (longer
// than 1024 bytes, invalid UTF-8 or NUL: only an Operation function of
// yours can return one), 401 when Config.Account fails, 413 past
// Config.MaxRequestBytes, 503 store_unavailable when PostgreSQL fails.
//
// # Waiting
//
// By default a request whose key is in flight is answered 409 at once, and
// the client retries. With Config.Wait, it waits instead, at most Wait, and
// is woken by the holder's end, not by polling: in transaction mode it asks,
// on a connection of its own outside the pool, for the lock of its key and
// fingerprint, which the holder holds until its transaction ends, bounded
// by lock_timeout (what is left of Wait), so PostgreSQL grants it the
// moment the holder commits, rolls back or loses its connection; it then
// looks at the key again as a first request does: COMPLETED gives the
// replay, no record (the holder released the key: 5xx, panic) makes it run
// the handler itself. Looks never block, so replays of a completed key do
// not queue on its lock; a waiter's lease starts when it holds the key.
// With a record of its own (NoLeaseTakeover) the holder takes an advisory
// lock on its record's token and waiters wait on that, the same way. When
// Wait ends first, the request gets 409 request_in_flight. A holder running
// with Config.NoTx holds no transaction during its handler, so its waiters
// look at the record again after a pause that doubles up to 50ms. Waiting
// requests hold no pooled connection (each its own while it waits), and are
// bounded per middleware: at most Config.MaxWaiters in all and
// Config.MaxKeyWaiters per key; a request past either bound gets 409 at
// once. A request waits at most 5 seconds for a pooled connection, then
// gets 503 store_unavailable.
//
// # Leases, takeover, reconciliation and expiry
//
// A request holds its key for Config.Lease (default 1 minute), and its
// handler's context ends then.
//
// Takeover, in transaction mode (the default). A handler still running when
// its lease ends is fenced out: the middleware ends its PostgreSQL session
// (pg_terminate_backend, from a connection of its own; the pool's role
// must be allowed to, as it is for its own sessions), which rolls back its
// transaction, with every business write and outbox message in it, and
// frees the key. The next request with the key runs, and the old holder,
// when its handler returns, gets 409 lease_lost; a holder never begins its
// completion after its lease ended (one begun just before may commit
// after it, which is safe: the lock is held until that commit). The fence
// runs on a connection of its own, outside the pool, and also when the
// client has gone; a failure to fence is logged, and the key then stays
// held until the handler returns. The middleware's transaction is READ
// COMMITTED, whatever the session's default: it reads the record after
// the lock was granted. Safety does not depend on clocks: the lock is the
// fence, held by PostgreSQL for exactly as long as the holder's
// transaction lives, and the lease only bounds how long that may be. A
// holder whose host vanished without closing its connection keeps its
// lock until PostgreSQL ends that session (TCP keepalives,
// idle_in_transaction_session_timeout); requests with its key get 409 until
// then, and never double its writes. A record left PROCESSING by an older
// version of this package (before migration 13) whose lease ended is taken
// over by the first request with the same fingerprint: its completion
// replaces the record only if it still has the token that request read
// (logged as a warning "lease ended", with the previous token). Records
// reserved with NoTx or NoLeaseTakeover (negative tokens) are never taken
// over, by a middleware of any mode.
//
// Reconciliation, with Config.NoTx or Config.NoLeaseTakeover. A record
// still PROCESSING after its lease is stuck: its holder crashed, hung or is
// slow; a holder past its lease that nobody settled still completes. Without the
// transaction, a stuck request's effects may have happened outside the
// database (the card was charged, then the process died), and a live holder
// may still be causing them: running the handler again could double them,
// and only the outside system knows. So such records are never taken over:
// requests with the key get 409 request_in_flight until a Reconciler settles
// the record, or it expires. Set NoLeaseTakeover in transaction mode too when
// a handler's effects do not all go through the transaction.
// Store.FindStuck lists stuck records and Store.Reconcile hands them to your
// Reconciler, which decides: AllowRetry (delete the record; the next request
// runs anew), MarkFailed (409 operation_failed until expiry), KeepUnknown
// (409 outcome_unknown until an operator calls Store.Resolve). For effects
// written in the middleware's transaction AllowRetry is always safe, for the
// reasons above. For effects outside it, ask the outside system first.
// `idemkit idemhttp stuck` lists stuck records. A reconciler also works
// alongside takeover, for keys no client retries.
//
// A record expires Config.TTL (default 24 hours) after it completed (in
// transaction mode), or after its lease would end (Lease + TTL after it was
// reserved with a record of its own), or TTL after it completed if that is
// later: a completed record always lives at least TTL after its
// completion. From then on its key is
// unknown: a request with it runs the handler anew, whatever the record's
// state. This is the contract, not a cache detail: choose a TTL longer than
// any retry you expect, and back critical effects with a business
// constraint that does not expire (for example a unique order reference).
// Store.Purge deletes expired records in batches, walking the table by
// ranges of pages; it only reclaims space.
// Leases and expiry are measured on StoreConfig.Now (default time.Now): keep
// the clocks of the processes sharing a table in step.
//
// # The IETF draft
//
// This follows draft-ietf-httpapi-idempotency-key-header where it speaks: 400
// for a missing key on an endpoint that requires one, 409 for a request whose
// key is being processed, 422 for a key reused with a different request, a
// fingerprint of the request, keys that expire. Where it differs:
//
//   - The draft makes the header a Structured Fields string ("quoted");
//     ParseKey accepts that and also the unquoted key most clients send.
//   - The draft suggests problem details (RFC 9457) for errors; this package
//     writes {"error":{...}} by default (Config.WriteError changes it).
//   - The draft defines no header marking a replay; Idempotent-Replayed is
//     ours. Responses with a retryable status (5xx by default) are not
//     stored, so a retry runs again; the draft leaves this to the server.
//   - Retry-After on 409, FAILED and UNKNOWN records, the lease, and the
//     scope by account and operation go beyond the draft.
//
// # Backends
//
// The middleware keeps its records through the Backend interface: New wires
// the PostgreSQL store of this package (the only one whose records commit
// with the handler's writes), NewWithBackend another, such as the Redis
// store of module github.com/idemkit/idemkit/idemredis, whose contract its own
// documentation states.
//
// # Tables
//
// The table is created by package migrate (fillfactor 70, the primary key
// only: no index on expiry or on stuck records, so Store.FindStuck and
// Store.Purge read the whole table); StoreConfig and migrate.Config must name the same schema and
// table. Nothing in this package runs DDL: without the table, Store methods
// return errors matching ErrNotMigrated, and the middleware answers 503
// store_unavailable and logs that error.
package idemhttp
