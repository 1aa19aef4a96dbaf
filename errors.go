// Package idemkit holds what every idemkit package shares: the error types
// a caller matches whichever package returned them. The packages that do
// the work are consumer, dedup, outbox, dlq, retry, idemhttp and migrate;
// the README maps them.
package idemkit

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// ErrNotMigrated is matched (errors.Is) by the ErrNotMigrated of every
// package (consumer, dedup, outbox, dlq, idemhttp): the schema lacks a
// table or a version that package needs. Run package migrate's Up with the
// same schema and table names (`idemkit migrate up`).
var ErrNotMigrated = errors.New("idemkit: schema not migrated: run migrate.Up (idemkit migrate up)")

// ErrInvalidConfig is matched (errors.Is) by the ErrInvalidConfig of every
// package (consumer, outbox, dlq, idemhttp, migrate, kafkaconn and the
// adapters): a constructor was given a configuration it refuses (a nil
// pool or config, a required field missing, a value out of range). Nothing
// was started or written.
var ErrInvalidConfig = errors.New("invalid config")

// PanicError is a panic of user code (a handler, a middleware, a
// reconciler) recovered and turned into an error: every package returns
// this one type. Error leaves the stack out, to keep log lines short.
type PanicError struct {
	// Where names the code that panicked, such as "consumer: handler".
	Where string
	// Value is what was passed to panic.
	Value any
	// Stack is the panicking goroutine's stack.
	Stack []byte
}

// NewPanicError returns the PanicError of v, recovered in where, with the
// stack of the calling goroutine: call it in the deferred function that
// recovered.
func NewPanicError(where string, v any) *PanicError {
	return &PanicError{Where: where, Value: v, Stack: debug.Stack()}
}

func (e *PanicError) Error() string { return fmt.Sprintf("%s panicked: %v", e.Where, e.Value) }

// Unwrap returns the panic value when it is an error (panic(err)), so that
// errors.Is and errors.As see through the panic.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}
