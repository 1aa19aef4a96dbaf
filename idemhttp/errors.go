package idemhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// The codes of error responses. They are stable: clients may match them.
const (
	// CodeKeyMissing (400): the endpoint requires an Idempotency-Key header.
	CodeKeyMissing = "idempotency_key_missing"
	// CodeKeyInvalid (400): the header is empty, longer than MaxKeyLength,
	// not printable ASCII, badly quoted, or repeated.
	CodeKeyInvalid = "idempotency_key_invalid"
	// CodeInvalidJSON (400): a JSON request body could not be canonicalised.
	CodeInvalidJSON = "invalid_json"
	// CodeInvalidRequest (400): the Intent function rejected the request.
	CodeInvalidRequest = "invalid_request"
	// CodeOperationInvalid (400): the request's operation (Config.Operation)
	// is longer than MaxOperationLength, not valid UTF-8 or holds NUL.
	CodeOperationInvalid = "operation_invalid"
	// CodeUnauthorized (401): the Account function returned an error.
	CodeUnauthorized = "unauthorized"
	// CodeRequestTooLarge (413): the body is longer than MaxRequestBytes.
	CodeRequestTooLarge = "request_too_large"
	// CodeKeyReused (422): the key was used with a different request.
	// Nothing was executed.
	CodeKeyReused = "idempotency_key_reused"
	// CodeInFlight (409, with Retry-After): a request with the key is
	// being processed. Retry later with the same key.
	CodeInFlight = "request_in_flight"
	// CodeLeaseLost (409, with Retry-After): this request's hold on its key
	// ended before it completed (its lease ended and it was fenced out, or
	// the reconciler settled its record), or a record of the key appeared
	// meanwhile; nothing it wrote in the transaction was committed. Retry
	// with the same key: the retry runs, or replays what committed.
	CodeLeaseLost = "lease_lost"
	// CodeOperationFailed (409): a reconciler marked the operation with this
	// key as failed. Use a new key.
	CodeOperationFailed = "operation_failed"
	// CodeOutcomeUnknown (409): the outcome of the operation with this key is
	// not known and awaits an operator. Do not retry with a new key before
	// checking that it did not happen.
	CodeOutcomeUnknown = "outcome_unknown"
	// CodeResponseTooLarge (500): the handler's response was longer than
	// MaxResponseBytes, so it could not be stored; the transaction was
	// rolled back and the key released.
	CodeResponseTooLarge = "response_too_large"
	// CodeInternal (500): the handler panicked or wrote an invalid status;
	// the transaction was rolled back and the key released.
	CodeInternal = "internal_error"
	// CodeStoreUnavailable (503, with Retry-After): the record store could
	// not be reached or the transaction failed to commit; whatever this
	// request did in its transaction was not committed, or it was completed
	// and a retry replays it. Retry with the same key.
	CodeStoreUnavailable = "store_unavailable"
)

// Error is an error response of the middleware. WriteErrorJSON writes it as
// {"error":{"code":"...","message":"..."}}.
type Error struct {
	// Status is the HTTP status.
	Status int
	// Code is one of the Code constants.
	Code string
	// Message says what happened, for people.
	Message string
	// RetryAfter, when positive, is sent as a Retry-After header (whole
	// seconds, at least 1).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("idemhttp: %d %s: %s", e.Status, e.Code, e.Message)
}

// WriteErrorJSON writes e as an application/json response:
//
//	{"error":{"code":"idempotency_key_reused","message":"..."}}
func WriteErrorJSON(w http.ResponseWriter, _ *http.Request, e *Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64(max(time.Second, e.RetryAfter+time.Second-1)/time.Second), 10))
	}
	type body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Error body `json:"error"`
	}{body{e.Code, e.Message}})
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(b, '\n'))
}

// ErrResponseTooLarge is returned by the ResponseWriter's Write when the
// handler's response exceeds MaxResponseBytes.
var ErrResponseTooLarge = errors.New("idemhttp: response larger than MaxResponseBytes")

// ErrTxManaged is returned by Commit and Rollback on the transaction Tx
// returns: the middleware commits it together with the record, or rolls it
// back.
var ErrTxManaged = errors.New("idemhttp: the middleware commits or rolls back this transaction; return a response instead")
