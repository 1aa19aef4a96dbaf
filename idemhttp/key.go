package idemhttp

import (
	"errors"
	"fmt"
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
// Idempotency-Key header.
var ErrKeyMissing = errors.New("idemhttp: missing Idempotency-Key header")

// ErrKeyInvalid matches (with errors.Is) every error ParseKey returns for a
// header that is present but unusable.
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
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", invalidKey("the header appears %d times", len(values))
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
					return "", invalidKey("data after the closing quote")
				}
				break
			}
			if c == '\\' {
				if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", invalidKey("invalid escape in a quoted key")
				}
				c = v[i+1]
				i++
			}
			b.WriteByte(c)
			i++
		}
		if !closed {
			return "", invalidKey("unterminated quoted key")
		}
		v = b.String()
	}
	switch {
	case v == "":
		return "", invalidKey("empty key")
	case len(v) > MaxKeyLength:
		return "", invalidKey("key of %d bytes, longer than %d", len(v), MaxKeyLength)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7E {
			return "", invalidKey("key contains a byte that is not printable ASCII (0x%02x at %d)", v[i], i)
		}
	}
	return v, nil
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
