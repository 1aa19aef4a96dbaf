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
//
// # Contract
//
// Keys. A scope (account, operation, Idempotency-Key) has two keys,
// Prefix + "{" + h + "}:lock" and ":rec", where h is 128 bits of the
// SHA-256 of the scope: the braces make h the Redis Cluster hash tag, so
// both keys of a scope are on one slot and every script below touches one
// slot. Accounts never share keys. The idempotency key and the account are
// not spelled out in Redis; what is stored is the request's fingerprint
// (an HMAC-SHA256 keyed with idemhttp.Config.FingerprintKeys), the response's status, allow-listed headers and body.
//
// Reservation. One Lua script, atomic in Redis: if the scope has a
// completed record, it is returned (the replay, or 422 when the fingerprint
// differs); else SET lock "token fingerprint" NX PX lease reserves the key
// with a fresh random 128-bit fencing token; else the lock's value and
// remaining lifetime are returned: 409 request_in_flight, or 422 at once
// when the holder's fingerprint differs. No request can slip between a
// completion and the deletion of its lock.
//
// Completion and release are compare-and-set on the token, each one
// script: the record is stored (SET rec … PX TTL) and the lock deleted only
// if the lock still holds this request's token, or if the lock expired and
// nobody took the key since (no lock, no record: a handler that finished
// just after its lease keeps its record, since its effect happened);
// release (a 5xx, a panic) deletes the lock only if it holds the token. So
// a holder whose lease ended cannot overwrite the record or free the lock
// of the request that holds the key after it: its completion fails
// (logged; the client still gets the handler's response, since its effects
// happened).
//
// Lease. The lock lives Config.Lease (PX); the handler's context ends at
// the same instant by this process's clock, which starts before the lock's.
// When the lease ends, the lock expires and the next request with the key
// runs: that is the takeover, and its fence is the token above. With
// idemhttp.Config.NoLeaseTakeover the lock lives for the TTL instead: a
// request whose holder crashed gets 409 until Store.Forget frees the key or
// the TTL passes.
//
// Waiting (idemhttp.Config.Wait). Completion and release publish on the
// scope's pub/sub channel. The requests of a process that wait share one
// subscription of the Store, to the channels of every scope under its
// prefix (PSUBSCRIBE), opened for the first waiter and closed with the
// last, which wakes the waiters of each message's scope: a duplicate
// registers there, looks again, and waits for the message, for the lock's
// expiry or for Wait to end, whichever comes first; it does not poll. So
// waiting takes one pub/sub connection per process, whatever the number of
// waiters, which idemhttp.Config.MaxWaiters and MaxKeyWaiters bound; while
// some request waits, the process receives the completions of every scope
// of the prefix.
//
// TTL. A completed record expires (PX) Config.TTL after its completion;
// from then on its key is unknown and runs anew.
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
package idemredis
