// Package idemredis keeps idemhttp's Idempotency-Key records in Redis: the
// design document's SET NX PX store, behind the same idemhttp.Backend
// contract as the PostgreSQL store, for HTTP services that have Redis and
// not PostgreSQL, or that want the key check off their primary database.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	store, err := idemredis.New(client, nil)
//	mw, err := idemhttp.NewWithBackend(store, &idemhttp.Config{Account: account, FingerprintKeys: secrets})
//	http.Handle("POST /payments", mw.Handler(payments))
//
// The middleware's behaviour is idemhttp's (fingerprint, 422, 409, replay,
// 5xx release, Wait, TTL): this package passes the same conformance suite
// (idemhttp/idemhttptest) as the PostgreSQL store. Built on go-redis v9.
// Example shows a payment endpoint behind the middleware with this store.
//
// # Contract
//
// A scope (account, operation, Idempotency-Key) has its keys under
// Config.Prefix, both on one Redis Cluster slot; accounts never share keys,
// and neither the idempotency key nor the account is spelled out in Redis:
// what is stored is the request's keyed fingerprint and the response's
// status, allow-listed headers and body.
//
// A request reserves its key atomically (one Lua script): a completed
// record is replayed (or 422 when the fingerprint differs), a key held by
// another request gets 409 request_in_flight (or 422 at once when the
// holder's fingerprint differs). Completion and release are fenced by a
// random token per reservation: a holder whose lease ended cannot overwrite
// the record or free the key of the request that holds it after it.
//
// The lock lives idemhttp.Config.Lease, and the handler's context ends
// then; when it ends, the next request with the key runs. With
// idemhttp.Config.NoLeaseTakeover the lock lives for the TTL instead, and a
// request whose holder crashed gets 409 until Store.Forget frees the key or
// the TTL passes. With idemhttp.Config.Wait, waiting requests are woken by
// pub/sub, on one subscription per Store. A completed record expires
// idemhttp.Config.TTL after its completion; from then on its key runs anew.
//
// # What it cannot promise
//
//   - No shared transaction with the business writes. The handler runs
//     without a transaction (idemhttp.Tx reports false) and its effects
//     happen wherever it makes them; the record is written after it
//     returns. A crash (of the process, or of Redis) between the effect and
//     the completion leaves the effect without its record: when the lease
//     ends the key runs again, and the effect may happen twice. Back
//     critical effects with an idempotency key of their own at the provider
//     or a business constraint, and reconcile: this is the price of keeping
//     the records off the database the effects live in.
//   - A handler that outlives its lease (it ignored its context) may run
//     at the same time as the next holder: the token fences the record, not
//     the effects.
//   - Redis must not evict these keys: run it with maxmemory-policy
//     noeviction (or no maxmemory). Every key here has a lifetime (PX), so
//     the volatile-* policies, and allkeys-*, may drop a live lock or record
//     under memory pressure, and a retry then runs again.
//   - Redis persistence and failover can lose a reservation or a record: a
//     server that restarts without its append-only file synced at every
//     write (appendfsync always), or a replica promoted before it received
//     the last writes (replication is asynchronous), forgets what it had
//     acknowledged, and a retry then runs again. With appendfsync always on
//     a single server, every acknowledged reservation and record survives a
//     restart; while Redis is unreachable requests get 503
//     store_unavailable and run nothing.
//   - No listing of stuck requests: a lock that expires frees its key by
//     itself, and one held with NoLeaseTakeover is found only by its key.
//
// The design (the keys and hash tags, the reservation, completion and
// release scripts, the lease, the shared pub/sub subscription) is explained
// in docs/design/idemredis.md in the repository.
package idemredis
