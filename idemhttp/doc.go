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
// header. Accounts never see each other's records; the same key on two
// operations is two keys.
//
// Reservation. The first request with a key reserves it in one autocommit
// statement (INSERT … ON CONFLICT DO NOTHING, never SELECT-then-INSERT), as
// PROCESSING with a lease (Config.Lease) and a fresh random token, so that
// concurrent requests see the reservation at once. It is not made inside
// the handler's transaction on purpose: an uncommitted reservation would
// make concurrent requests wait on the unique index instead of being
// answered. In transaction mode the reservation's commit does not wait for
// its WAL flush (synchronous_commit off for that one statement): a record
// can only become COMPLETED in the later, synchronous commit, which flushes
// the reservation with it, and a reservation lost in a server crash only
// frees a key whose request never completed.
//
// Execution. The handler then runs in a transaction the middleware begins
// on the connection the key was reserved on (Tx returns it): one pooled
// connection serves the whole request, and is held until it is answered.
// After the handler returns, the middleware stores the response and marks
// the record COMPLETED with an UPDATE that matches the token, in that same
// transaction, and commits, in one round trip: the business writes, the
// outbox messages and the COMPLETED record commit together or not at all.
// If the token no longer matches (after its lease ended, the record was
// taken over by another request or handed to the reconciler), the UPDATE
// fails, the transaction is rolled back and the client gets 409 lease_lost:
// a holder that lost its lease cannot complete. The completing UPDATE
// changes no indexed column when it comes within the lease, so PostgreSQL
// makes it a HOT update (migration 11).
// The response is buffered and sent only after the commit, so a client never
// sees a success that was not committed. With Config.NoTx the handler runs
// without a transaction and the record is completed by its own statement.
//
// Fingerprint. Each request has a fingerprint: the SHA-256 of the operation
// and the request's intent (Config.Intent). By default the intent is the
// sorted query and the canonical JSON of a JSON body (CanonicalJSON: key
// order, insignificant whitespace and number forms do not matter), else the
// raw body; IntentJSON selects the members that define the intent. Headers,
// credentials and the body itself are never stored, only the hash.
//
// Answers to a request whose key has a live record:
//
//   - other fingerprint: 422 idempotency_key_reused, nothing executed (this
//     check comes first, whatever the record's state);
//   - PROCESSING: 409 request_in_flight with Retry-After at once, or, with
//     Config.Wait, the answer once the first request finishes (see Waiting);
//     once its lease ended, in transaction mode, the request takes it over
//     and runs (see Leases);
//   - COMPLETED: the stored status, allow-listed headers and body, with
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
// than 1024 bytes, invalid UTF-8 or NUL: a default operation holds the URL
// path the client sent), 401 when Config.Account fails, 413 past
// Config.MaxRequestBytes, 503 store_unavailable when PostgreSQL fails.
//
// # Waiting
//
// By default a request whose key is in flight is answered 409 at once, and
// the client retries. With Config.Wait, it waits instead, at most Wait: in
// transaction mode the holder takes a PostgreSQL advisory lock on its
// record's token in its transaction, and the waiter waits on that lock
// (lock_timeout bounds it), so PostgreSQL wakes it the moment the holder
// commits, rolls back or loses its connection, without polling. The waiter
// then looks at the record again: COMPLETED gives the replay; a key released
// by a failed holder (5xx, panic) is reserved by the waiter, which runs the
// handler itself; a record taken over makes it wait for the new holder.
// When Wait ends first, it gets 409 request_in_flight. A holder running
// with Config.NoTx holds no transaction during its handler, so its waiters
// look at the record again after a pause that doubles up to 50ms; so do
// waiters in the instants between a holder's reservation and its lock, or
// between its rollback and its release. Each waiting request holds a
// pooled connection while it waits: size the pool for the waiters you
// expect, or keep Wait short.
//
// # Leases, takeover, reconciliation and expiry
//
// A request holds its key for Config.Lease (default 1 minute) from its
// reservation, and its handler's context ends then. A record still
// PROCESSING after its lease is stuck: its holder crashed, hung or is slow.
// A holder past its lease that nobody took over still completes normally.
//
// Takeover, in transaction mode (the default). The first request with the
// key and the same fingerprint that finds the lease ended takes the record
// over: one UPDATE, matching the token it read and the record still
// PROCESSING past its lease, gives the record a new token, a new lease and
// a new expiry (TTL from now), and the request runs the handler. The
// takeover is a compare-and-set on the row, so of several requests racing
// for one record exactly one takes it over; the others find a live lease
// again (409 request_in_flight, or with Config.Wait the replay). A request
// with another fingerprint still gets 422 and changes nothing. The old
// holder is fenced out: if it is still running, its completion matches its
// own token, which is gone, so it gets 409 lease_lost and its transaction,
// with every business write and outbox message in it, is rolled back (its
// release, after a failure, matches its token too and frees nothing). If it
// completed before the takeover, the taker finds the record COMPLETED and
// replays it. This is safe because every effect of the handler is in the
// middleware's transaction: a crashed holder's transaction never commits
// (PostgreSQL rolls it back when its connection ends), a live one can no
// longer commit. Safety does not depend on clocks: a clock that runs ahead
// only takes over early, and the early holder's work is lost, not doubled. A
// holder whose host vanished without closing its connection keeps its
// transaction, and the row locks of its writes, open until PostgreSQL ends
// that session (TCP keepalives, idle_in_transaction_session_timeout): the
// taker may wait on those locks, it never doubles the writes.
// A takeover is logged (warning "lease ended", with the previous token).
//
// Reconciliation, with Config.NoTx or Config.NoLeaseTakeover. Without the
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
// A record expires Config.TTL (default 24 hours) after its lease would end
// (Lease + TTL after it was reserved or taken over), or TTL after it
// completed if that is later: a completed record always lives at least TTL
// after its completion. (The expiry set at the reservation covers a
// completion within the lease, so that completing does not change it.) From then on its key is
// unknown: a request with it runs the handler anew, whatever the record's
// state. This is the contract, not a cache detail: choose a TTL longer than
// any retry you expect, and back critical effects with a business
// constraint that does not expire (for example a unique order reference).
// Store.Purge deletes expired records in batches; it only reclaims space.
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
// # Tables
//
// The table is created by package migrate (version 3, and version 11 for
// the layout this package expects: without the index of stuck records, so
// Store.FindStuck reads the whole table, and with fillfactor 70); StoreConfig and
// migrate.Config must name the same schema and table. Nothing in this
// package runs DDL: without the table, Store methods return errors matching
// ErrNotMigrated, and the middleware answers 503 store_unavailable and logs
// that error.
package idemhttp
