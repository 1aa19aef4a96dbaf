package idemhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on every response replayed from a record.
const HeaderReplayed = "Idempotent-Replayed"

// MaxKeyLength is the longest idempotency key, in bytes, after unquoting.
const MaxKeyLength = 255

// MaxAccountLength is the longest account the Account function may return, in bytes.
const MaxAccountLength = 255

// MaxOperationLength is the longest operation the Operation function may
// return, in bytes.
const MaxOperationLength = 1024

// ErrKeyMissing is returned by ParseKey when the request has no
// Idempotency-Key header, and matched (with errors.Is) by the errors of
// KeyFromHeader and KeyFromJSON for a request without its key.
var ErrKeyMissing = errors.New("idemhttp: missing Idempotency-Key header")

// ErrKeyInvalid matches (with errors.Is) every error ParseKey returns for a
// header that is present but unusable, and those of KeyFromHeader and
// KeyFromJSON for a key that is present but unusable.
var ErrKeyInvalid = errors.New("idemhttp: invalid Idempotency-Key header")

func invalidKey(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrKeyInvalid, fmt.Sprintf(format, args...))
}

// ParseKey returns the idempotency key carried by the Idempotency-Key header
// values of one request (http.Header.Values). The IETF draft makes the field
// a Structured Fields string: `Idempotency-Key: "8e03978e-40d5"`; ParseKey
// accepts that form, with its \" and \\ escapes, and also the unquoted form
// most clients send (`Idempotency-Key: 8e03978e-40d5`): both carry the same
// key. The key must be 1 to MaxKeyLength bytes of printable ASCII (0x20 to
// 0x7E) after unquoting, and the header must appear once. A missing header
// returns ErrKeyMissing; anything else wrong returns an error matching
// ErrKeyInvalid.
func ParseKey(values []string) (string, error) {
	return parseKeyHeader(HeaderKey, values)
}

// KeyFunc returns the idempotency key of a request, from its headers or its
// body (the whole body, read up to Config.MaxRequestBytes; the handler reads
// it again afterwards). An error matching ErrKeyMissing answers 400
// idempotency_key_missing (or, with Config.Optional, lets the request through
// unprotected), one matching ErrKeyInvalid 400 idempotency_key_invalid, one
// matching ErrInvalidJSON 400 invalid_json, any other 400 invalid_request;
// the error's text is the message, so it must not quote the body. The key it
// returns must be 1 to MaxKeyLength bytes of printable ASCII, else the
// request gets 400 idempotency_key_invalid.
type KeyFunc func(r *http.Request, body []byte) (string, error)

// KeyFromHeader returns a KeyFunc that takes the key from the request header
// name, with the rules of ParseKey: for a provider's delivery ID
// (KeyFromHeader("X-GitHub-Delivery"), KeyFromHeader("webhook-id")).
func KeyFromHeader(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request, _ []byte) (string, error) {
		return parseKeyHeader(name, r.Header.Values(name))
	}
}

// KeyFromJSON returns a KeyFunc that takes the key from a string member of
// the request's JSON body, selected by an RFC 6901 JSON Pointer ("/id",
// "/data/object/id"; a name without a leading slash is a top-level member:
// "id" is "/id"), whatever the Content-Type: for a provider that names its
// event in the body (Stripe's "id"). A body that is not JSON (as
// CanonicalJSON reads it: duplicate member names are refused) answers 400
// invalid_json, a missing member 400 idempotency_key_missing, a member that
// is not a string 400 idempotency_key_invalid.
func KeyFromJSON(member string) KeyFunc {
	ptr := member
	if !strings.HasPrefix(ptr, "/") {
		ptr = "/" + strings.ReplaceAll(strings.ReplaceAll(ptr, "~", "~0"), "/", "~1")
	}
	return func(_ *http.Request, body []byte) (string, error) {
		p, err := canonicalize(body)
		if err != nil {
			return "", fmt.Errorf("idemhttp: idempotency key from the JSON member %q: %w", member, err)
		}
		v, ok := lookupCanonical(p.out, ptr)
		if !ok {
			return "", &keyError{kind: ErrKeyMissing, msg: fmt.Sprintf("idemhttp: the JSON body has no member %q", member)}
		}
		if v[0] != '"' {
			return "", &keyError{kind: ErrKeyInvalid,
				msg: fmt.Sprintf("idemhttp: the JSON member %q is %s, not a string", member, jsonKind(v[0]))}
		}
		var key string
		if err := json.Unmarshal(v, &key); err != nil {
			return "", fmt.Errorf("idemhttp: idempotency key from the JSON member %q: %w", member, err)
		}
		if err := checkKey(key); err != nil {
			return "", &keyError{kind: ErrKeyInvalid, msg: fmt.Sprintf("idemhttp: the JSON member %q: %s", member, err)}
		}
		return key, nil
	}
}

// jsonKind names the kind of a canonical JSON value by its first byte.
func jsonKind(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// keyError is an error of a KeyFunc of this package or of a key a KeyFunc
// returned: it matches ErrKeyMissing or ErrKeyInvalid.
type keyError struct {
	kind error
	msg  string
}

func (e *keyError) Error() string        { return e.msg }
func (e *keyError) Is(target error) bool { return target == e.kind }

// parseKeyHeader is ParseKey for the header name.
func parseKeyHeader(name string, values []string) (string, error) {
	invalid := func(format string, args ...any) error {
		if name == HeaderKey {
			return invalidKey(format, args...)
		}
		return &keyError{kind: ErrKeyInvalid, msg: fmt.Sprintf("idemhttp: invalid %s header: %s", name, fmt.Sprintf(format, args...))}
	}
	switch len(values) {
	case 0:
		if name == HeaderKey {
			return "", ErrKeyMissing
		}
		return "", &keyError{kind: ErrKeyMissing, msg: "idemhttp: missing " + name + " header"}
	case 1:
	default:
		return "", invalid("the header appears %d times", len(values))
	}
	v := strings.Trim(values[0], " \t")
	if strings.HasPrefix(v, `"`) {
		var b strings.Builder
		i := 1
		closed := false
		for i < len(v) {
			c := v[i]
			if c == '"' {
				closed = i == len(v)-1
				if !closed {
					return "", invalid("data after the closing quote")
				}
				break
			}
			if c == '\\' {
				if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", invalid("invalid escape in a quoted key")
				}
				c = v[i+1]
				i++
			}
			b.WriteByte(c)
			i++
		}
		if !closed {
			return "", invalid("unterminated quoted key")
		}
		v = b.String()
	}
	if err := checkKey(v); err != nil {
		return "", invalid("%s", err)
	}
	return v, nil
}

// checkKey checks a key: 1 to MaxKeyLength bytes of printable ASCII.
func checkKey(v string) error {
	switch {
	case v == "":
		return errors.New("empty key")
	case len(v) > MaxKeyLength:
		return fmt.Errorf("key of %d bytes, longer than %d", len(v), MaxKeyLength)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7E {
			return fmt.Errorf("key contains a byte that is not printable ASCII (0x%02x at %d)", v[i], i)
		}
	}
	return nil
}

// validateAccount checks an account the Account function returned.
func validateAccount(a string) error {
	switch {
	case a == "":
		return errors.New("empty account")
	case len(a) > MaxAccountLength:
		return fmt.Errorf("account of %d bytes, longer than %d", len(a), MaxAccountLength)
	case !utf8.ValidString(a):
		return errors.New("account is not valid UTF-8")
	case strings.IndexByte(a, 0) >= 0:
		return errors.New("account contains NUL")
	}
	return nil
}

// validateOperation checks an operation the Operation function returned:
// one with NUL or invalid UTF-8 cannot be stored in a text column, and a
// very long one not in the records' primary key.
func validateOperation(op string) error {
	switch {
	case len(op) > MaxOperationLength:
		return fmt.Errorf("operation of %d bytes, longer than %d", len(op), MaxOperationLength)
	case !utf8.ValidString(op):
		return errors.New("operation is not valid UTF-8")
	case strings.IndexByte(op, 0) >= 0:
		return errors.New("operation contains NUL")
	}
	return nil
}
