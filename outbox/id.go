package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
)

// newID returns a version 7 UUID (RFC 9562): 48 bits of Unix milliseconds,
// then 74 random bits from crypto/rand. IDs made later sort later (to the
// millisecond), which keeps the unique index on id append-mostly.
func newID() (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[6:]); err != nil {
		return "", fmt.Errorf("random ID: %w", err)
	}
	ms := uint64(time.Now().UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // variant 10
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:]), nil
}

// validID reports whether s is a UUID in its canonical textual form.
func validID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range []byte(s) {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}
