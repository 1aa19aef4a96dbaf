// Package idemhttp is an Idempotency-Key middleware for net/http handlers,
// with its records in PostgreSQL next to your business data. A client that
// does not know whether its POST happened (the response was lost) sends it
// again with the same Idempotency-Key; the handler's effect happens once and
// the client gets the first outcome. The handler runs in the middleware's
// transaction (Tx returns it), so its writes, its outbox messages and the
// idempotency record commit together or not at all.
//
// ExampleMiddleware shows a payment handler behind the middleware, a retry
// that gets the stored answer and a reused key that gets 422;
// ExampleConfig_wait, ExampleStore_Reconcile and ExampleCanonicalJSON show
// waiting for an in-flight request, settling stuck records and the
// canonical form of a JSON body.
//
// # Contract
//
// Scope. A record is keyed by (account, operation, key): the account from
// Config.Account (your authentication), the operation from the method and
// route pattern (Config.Operation), the key from the Idempotency-Key header
// or from where Config.Key takes it (KeyFromHeader, KeyFromJSON). Accounts
// never see each other's records. A replay skips the handler and its own
// permission checks: make the account identify the principal, not only the
// tenant, unless everyone in a tenant may see every response of the tenant.
//
// Fingerprint. Each request has a fingerprint: the HMAC-SHA256, keyed with
// Config.FingerprintKeys (required, rotatable), of the operation, the
// method, the path as sent and the intent (Config.Intent; by default the
// sorted query, the media type and the CanonicalJSON of a JSON body, else
// the raw body). Headers, credentials and bodies are never stored, only the
// keyed hash.
//
// Answers to a request whose key has a live record:
//
//   - another fingerprint: 422 idempotency_key_reused, nothing executed;
//   - in flight: 409 request_in_flight with Retry-After, or with Config.Wait
//     the first request's answer once it finishes (at most
//     Config.MaxWaiters waiters per middleware, Config.MaxKeyWaiters per key);
//   - completed: the stored status, allow-listed headers
//     (Config.StoredHeaders) and body, with Idempotent-Replayed: true;
//   - failed or unknown (set by a Reconciler): 409 operation_failed or
//     outcome_unknown.
//
// Outcomes. The response is buffered and sent only after the commit. A
// response whose status Config.Retryable accepts (by default 5xx, 408, 425,
// 429), a panic (500) and a response longer than Config.MaxResponseBytes
// (500 response_too_large) roll the transaction back and release the key:
// a retry runs the handler again. Every other response, definitive 4xx
// included, is stored, committed and replayed: a handler that answers 4xx
// after writing must undo its writes (validate first, or use a savepoint).
//
// Errors of the middleware are JSON, {"error":{"code":"...","message":"..."}}
// (Config.WriteError changes the form), with the stable codes of the Code
// constants: 400 for a missing or malformed key or invalid JSON, 401 when
// Config.Account fails, 413 past Config.MaxRequestBytes, 503
// store_unavailable when PostgreSQL fails. ParseKey accepts the quoted key of
// draft-ietf-httpapi-idempotency-key-header and the unquoted key most
// clients send.
//
// Leases. A request holds its key for Config.Lease (LeaseDefault, 1
// minute), and its handler's context ends then. In transaction mode (the
// default) a handler still running at the end of its lease is fenced out:
// its PostgreSQL session is ended, its transaction rolled back, and the next
// request with the key runs (the old holder gets 409 lease_lost). With
// Config.NoTx or Config.NoLeaseTakeover, whose effects may live outside the
// database, a stuck key is never taken over: Store.FindStuck lists such
// records and Store.Reconcile hands them to your Reconciler (AllowRetry,
// MarkFailed, KeepUnknown; Store.Resolve settles KeepUnknown).
//
// Expiry. A record expires Config.TTL (TTLDefault, 24 hours) after it
// completed; from then on its key is unknown and a request with it runs the
// handler anew. Choose a TTL longer than any retry you expect, and back
// critical effects with a business constraint that does not expire.
// Store.Purge reclaims the space of expired records. Leases and expiry are
// measured on StoreConfig.Now: keep the clocks of the processes sharing a
// table in step.
//
// Backends and tables. New uses the PostgreSQL store of this package, the
// only one whose records commit with the handler's writes; NewWithBackend
// takes another Backend, such as module github.com/idemkit/idemkit/idemredis.
// The table is created by package migrate (StoreConfig and migrate.Config
// must name the same schema and table); without it Store methods return
// errors matching ErrNotMigrated and the middleware answers 503.
//
// The design (advisory locks and round trips, waiting, fencing, records of
// their own, expiry, the differences from the IETF draft) is explained in
// docs/design/idemhttp.md in the repository.
package idemhttp
