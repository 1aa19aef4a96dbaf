// Package pgtext makes free text, such as an error's message, storable in a
// PostgreSQL text column and in the other places idemkit copies it to.
//
// PostgreSQL rejects a text value that holds a NUL byte or is not valid
// UTF-8 (SQLSTATE 22021, character_not_in_repertoire) and fails the whole
// statement, and so the transaction it runs in. Error text comes from user
// handlers, drivers and peers, and may hold anything: storing it raw lets
// one bad message wedge the work around it. Every piece of error text
// idemkit writes to PostgreSQL goes through [Text] first.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Replacement stands in for each NUL byte and each run of bytes that is not
// valid UTF-8: U+FFFD, the Unicode replacement character.
const Replacement = "\uFFFD"

// Ellipsis ends a text [Text] cut short.
const Ellipsis = "…"

// Text returns s in a form PostgreSQL stores in a text column: every NUL
// byte and every run of invalid UTF-8 becomes [Replacement], and the result
// is cut on a rune boundary to at most max bytes; a text cut short ends with
// [Ellipsis] (counted in max). max <= 0 means no limit. Text is
// deterministic, and Text(Text(s, max), max) == Text(s, max).
func Text(s string, max int) string {
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", Replacement)
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, Replacement)
	}
	if max <= 0 || len(s) <= max {
		return s
	}
	if max < len(Ellipsis) {
		return cut(s, max)
	}
	return cut(s, max-len(Ellipsis)) + Ellipsis
}

// cut returns the longest prefix of the valid UTF-8 string s that has at
// most n bytes and ends on a rune boundary.
func cut(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
