package idemhttp

import (
	"context"
	"net/http"
	"time"
)

// Outcome is what the middleware did with a request, for Config.Observe.
type Outcome string

// Outcomes of a request.
const (
	// OutcomeFirst: the handler ran and its response was stored.
	OutcomeFirst Outcome = "first"
	// OutcomeReplay: the stored response of an earlier request was sent.
	OutcomeReplay Outcome = "replay"
	// OutcomeInFlight: 409, a request with the same key was in flight.
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeMismatch: 422, the key was used with another request.
	OutcomeMismatch Outcome = "mismatch"
	// OutcomeReleased: the handler's response was retryable (5xx by
	// default) or it failed: nothing was stored, the key is free again.
	OutcomeReleased Outcome = "released"
	// OutcomeLeaseLost: 409, another request took the key over before this
	// one completed; nothing it wrote was committed.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeSettled: 409, a reconciler settled the key as failed or
	// unknown.
	OutcomeSettled Outcome = "settled"
	// OutcomeInvalid: refused before anything ran (a missing or invalid
	// key, account, operation or body).
	OutcomeInvalid Outcome = "invalid"
	// OutcomeUnavailable: 503, the record store could not be reached.
	OutcomeUnavailable Outcome = "unavailable"
	// OutcomeNoKey: Config.Optional let a request without a key through.
	OutcomeNoKey Outcome = "no_key"
)

// Event is one request the middleware answered, for Config.Observe. The
// scope is empty when the request was refused before it was known.
type Event struct {
	Account, Operation, Key string
	Outcome                 Outcome
	// Status is the response's status code.
	Status int
	// Duration is from the request's arrival at the middleware to its
	// answer.
	Duration time.Duration
}

// observation collects an Event along the request's way.
type observation struct {
	account, operation, key string
	code                    string
	noKey                   bool
}

type observationKey struct{}

func observed(r *http.Request) *observation {
	o, _ := r.Context().Value(observationKey{}).(*observation)
	return o
}

// noteScope records the request's scope once it is known.
func noteScope(r *http.Request, account, operation, key string) {
	if o := observed(r); o != nil {
		o.account, o.operation, o.key = account, operation, key
	}
}

// observe wraps serve to report the request to Config.Observe.
func (m *Middleware) observe(w http.ResponseWriter, r *http.Request, next http.Handler) {
	start := time.Now()
	o := &observation{}
	r = r.WithContext(context.WithValue(r.Context(), observationKey{}, o))
	sw := &statusWriter{ResponseWriter: w}
	m.serve(sw, r, next)
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	e := Event{Account: o.account, Operation: o.operation, Key: o.key, Status: status, Duration: time.Since(start)}
	switch {
	case o.noKey:
		e.Outcome = OutcomeNoKey
	case o.code == CodeInFlight:
		e.Outcome = OutcomeInFlight
	case o.code == CodeKeyReused:
		e.Outcome = OutcomeMismatch
	case o.code == CodeLeaseLost:
		e.Outcome = OutcomeLeaseLost
	case o.code == CodeOperationFailed, o.code == CodeOutcomeUnknown:
		e.Outcome = OutcomeSettled
	case o.code == CodeStoreUnavailable:
		e.Outcome = OutcomeUnavailable
	case o.code == CodeInternal, o.code == CodeResponseTooLarge:
		e.Outcome = OutcomeReleased
	case o.code != "":
		e.Outcome = OutcomeInvalid
	case sw.Header().Get(HeaderReplayed) == "true":
		e.Outcome = OutcomeReplay
	case m.cfg.Retryable(status):
		e.Outcome = OutcomeReleased
	default:
		e.Outcome = OutcomeFirst
	}
	m.cfg.Observe(r.Context(), e)
}

// statusWriter records the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the writer's other features.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
