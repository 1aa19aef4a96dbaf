package dedup

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"
)

// MaxIDLength is the longest consumer name or message ID, in bytes.
const MaxIDLength = 255

// ErrInvalidID matches (with errors.Is) every *InvalidIDError.
var ErrInvalidID = errors.New("dedup: invalid id")

// InvalidIDError reports a consumer name or message ID that cannot be stored.
// errors.Is(err, ErrInvalidID) is true for it.
type InvalidIDError struct {
	// Field names what was checked, such as "MessageID".
	Field string
	// Value is the rejected value.
	Value string
	// Reason says what is wrong with it.
	Reason string
}

// Error names the field and the reason, and shows a quoted prefix of the value.
func (e *InvalidIDError) Error() string {
	return fmt.Sprintf("invalid %s %.32q: %s", e.Field, e.Value, e.Reason)
}

// Is reports whether target is ErrInvalidID.
func (e *InvalidIDError) Is(target error) bool { return target == ErrInvalidID }

// ValidateID checks a consumer name or message ID: it must be non-empty, at
// most MaxIDLength bytes, valid UTF-8, and free of NUL and other control
// characters (so IDs print safely in logs and compare byte for byte). field
// names the value in the error, which is an *InvalidIDError.
func ValidateID(field, v string) error {
	if printableASCII(v) {
		return nil
	}
	reason := ""
	switch {
	case v == "":
		reason = "empty"
	case len(v) > MaxIDLength:
		reason = fmt.Sprintf("%d bytes, longer than %d", len(v), MaxIDLength)
	case !utf8.ValidString(v):
		reason = "not valid UTF-8"
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		reason = "contains a control character"
	default:
		return nil
	}
	return &InvalidIDError{Field: field, Value: v, Reason: reason}
}

// printableASCII reports whether v is a valid ID made of printable ASCII
// only, as most IDs are: the common case, checked without decoding runes.
func printableASCII(v string) bool {
	if v == "" || len(v) > MaxIDLength {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}

// compactID returns id as a uuid when id is a UUID in canonical form (36
// characters: lower-case hex digits in groups of 8-4-4-4-12 separated by
// hyphens, as PostgreSQL prints a uuid), so that it is stored in 16 bytes;
// any other ID returns an invalid (NULL) uuid and is stored as text. Only
// the canonical form qualifies: it is the one uuid::text gives back, so the
// stored uuid and the ID are one and the same string, and "ABC…" (upper
// case) or "{…}" stay distinct IDs, as they were as text.
func compactID(id string) pgtype.UUID {
	var u pgtype.UUID
	if len(id) != 36 {
		return u
	}
	j := 0
	for i := 0; i < 36; i++ {
		switch i {
		case 8, 13, 18, 23:
			if id[i] != '-' {
				return u
			}
			continue
		}
		h, ok := hexDigit(id[i])
		if !ok {
			return u
		}
		if j%2 == 0 {
			u.Bytes[j/2] = h << 4
		} else {
			u.Bytes[j/2] |= h
		}
		j++
	}
	u.Valid = true
	return u
}

// hexDigit decodes a lower-case hex digit.
func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
