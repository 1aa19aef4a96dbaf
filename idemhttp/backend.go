package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// Backend is where the middleware keeps its records: the contract between
// the middleware and a store. This package's PostgreSQL store is one
// (New wires it); the module github.com/idemkit/idemkit/idemredis has one on
// Redis (NewWithBackend). Every Backend passes the same conformance
// suite (package idemhttp/idemhttptest).
//
// A Backend must make Reserve atomic per (account, operation, key): of
// requests racing for a key that has no live record, exactly one gets a
// Hold, and a Hold whose lease ended can no longer complete once another
// request holds the key (fencing). What it stores is the fingerprint and
// the response, never the request.
type Backend interface {
	// Reserve gives the caller the key of req (a Reservation with a Hold),
	// or describes the live record that has it. With req.Wait > 0 it waits,
	// at most that long, for a request in flight with the same fingerprint
	// to finish, and then answers with what that request left (its replay,
	// or a Hold when it released the key). An error means the store failed:
	// the middleware answers 503 store_unavailable.
	Reserve(ctx context.Context, req *Request) (Reservation, error)
}

// Request is what a Backend is asked to reserve.
type Request struct {
	Account, Operation, Key string
	// Fingerprint is the HMAC-SHA256 of the request's operation, method,
	// path and intent under the first of Config.FingerprintKeys.
	Fingerprint []byte
	// OlderFingerprints are the same under the older keys: a stored
	// fingerprint equal to one of them is the same request (SameRequest).
	OlderFingerprints [][]byte
	// Lease is how long the holder may take; after it, the key may be given
	// to another request (see NoTakeover) and the holder can no longer
	// complete.
	Lease time.Duration
	// TTL is how long a completed record is replayed.
	TTL time.Duration
	// Wait is how long to wait for a request in flight (Config.Wait).
	Wait time.Duration
	// NoTx asks for a Hold without a transaction (Config.NoTx). Stores that
	// have no transactions ignore it: their Holds never have one.
	NoTx bool
	// NoTakeover asks that a record whose holder's lease ended is not given
	// to another request until a reconciler settled it or it expired
	// (Config.NoLeaseTakeover; with NoTx too on PostgreSQL).
	NoTakeover bool
}

// SameRequest reports whether a stored fingerprint is this request's, under
// the current key or an older one.
func (r *Request) SameRequest(fingerprint []byte) bool {
	if bytes.Equal(fingerprint, r.Fingerprint) {
		return true
	}
	for _, f := range r.OlderFingerprints {
		if bytes.Equal(fingerprint, f) {
			return true
		}
	}
	return false
}

// Reservation is the answer of Backend.Reserve: either Hold is set (the
// caller holds the key and must end the hold with Complete or Release), or
// the other fields describe the live record that has the key.
type Reservation struct {
	// Hold is non-nil when the caller holds the key.
	Hold Hold
	// TakenOver is true when the key was reserved by taking over a record
	// whose holder's lease ended; PreviousToken is that holder's fencing
	// token (logged).
	TakenOver     bool
	PreviousToken int64

	// State is the state of the record that has the key (PROCESSING while a
	// request is in flight).
	State State
	// Fingerprint is that record's fingerprint; nil when the store cannot
	// tell (a request in flight that has no stored record yet): the
	// middleware then answers by Mismatch and State.
	Fingerprint []byte
	// Mismatch is true when the store knows that the request holding the
	// key has another fingerprint than the caller's without knowing which
	// (a request in flight that has no stored record yet): the middleware
	// answers 422, as for a Fingerprint that differs.
	Mismatch bool
	// Response is the stored response of a COMPLETED record.
	Response Response
}

// Response is a stored response: what a replay sends.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Hold is a request's hold on its key, from Reserve to Complete or Release:
// exactly one of them is called, once, after Run returned.
type Hold interface {
	// Run calls f once with a context that ends when the lease does (or ctx
	// ends), and with the transaction the effects commit in, or nil when the
	// hold has none. It returns when f does.
	Run(ctx context.Context, f func(ctx context.Context, tx pgx.Tx))
	// Complete stores resp as the record's outcome (committing the
	// transaction with it, if any). It returns an error matching
	// ErrLeaseLost when the hold ended first (its lease ended and the key
	// was, or may be, given to another request): then nothing was committed.
	Complete(ctx context.Context, resp Response) error
	// Release gives the key up without an outcome (rolling the transaction
	// back, if any): the next request with it runs anew.
	Release(ctx context.Context) error
}

// ErrLeaseLost is returned by Hold.Complete when the hold ended before the
// completion: the middleware answers 409 lease_lost.
var ErrLeaseLost = errors.New("idemhttp: lease lost")
