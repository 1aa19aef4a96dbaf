package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Redaction: what the commands that show payloads (dlq list, dlq inspect,
// consumer parked list, outbox parked) mask unless -show-payload is given.
// It is the default because these commands run in shells whose output is
// pasted into tickets and chats, and a dead letter is a message that failed:
// often one with data nobody expected (card numbers in a free-text field).
// Masking can over-reach (a 13-digit millisecond timestamp looks like a card
// number); -show-payload shows everything verbatim when that is in the way.

// redactedMark replaces what is masked whole.
const redactedMark = "***"

// sensitiveDefault are the JSON fields and header names whose values are
// masked whole, compared without case, '-' and '_'.
var sensitiveDefault = []string{
	"password", "passwd", "secret", "token", "access_token", "refresh_token", "api_key", "apikey",
	"authorization", "cookie", "set-cookie", "card", "card_number", "cardnumber", "pan", "cvv", "cvc", "cvv2",
	"expiry", "exp_month", "exp_year", "iban", "account_number", "ssn", "pin",
}

// maskCards masks, in every run of 13 to 19 digits, every digit but the
// last four: the shape of a payment card number (PAN). A run may
// be grouped by up to two spaces, dots or dashes between digits, and may
// touch letters ("card_4111…", "pan4111…"): no word boundary is needed.
func maskCards(s string) string {
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	isSep := func(c byte) bool { return c == ' ' || c == '.' || c == '-' }
	b := []byte(s)
	for i := 0; i < len(b); {
		if !isDigit(b[i]) {
			i++
			continue
		}
		start, end, digits := i, i, 0
		for j := i; j < len(b); {
			if isDigit(b[j]) {
				digits++
				j++
				end = j
				continue
			}
			k := j
			for k < len(b) && k-j < 2 && isSep(b[k]) {
				k++
			}
			if k == j || k == len(b) || !isDigit(b[k]) {
				break
			}
			j = k
		}
		if digits >= 13 && digits <= 19 { // longer runs are IDs, not cards
			keep := 4
			for p := end - 1; p >= start; p-- {
				if !isDigit(b[p]) {
					continue
				}
				if keep > 0 {
					keep--
				} else {
					b[p] = '*'
				}
			}
		}
		i = end
	}
	return string(b)
}

type redactor struct {
	show    bool // -show-payload: nothing is masked
	redact  bool // -redact: the default, said explicitly
	fields  map[string]bool
	regexps []*regexp.Regexp
	extra   string // -redact-fields
}

// register registers the redaction flags.
func (r *redactor) register(fs *flag.FlagSet) {
	fs.BoolVar(&r.show, "show-payload", false,
		"show keys, values, headers and errors verbatim (by default they are redacted)")
	fs.BoolVar(&r.redact, "redact", true, "redact keys, values, headers and errors (the default; -show-payload turns it off)")
	fs.StringVar(&r.extra, "redact-fields", "",
		"more JSON fields and header names to mask whole, comma-separated (also $IDEMKIT_REDACT_FIELDS; always masked: "+
			strings.Join(sensitiveDefault, ",")+")")
	fs.Func("redact-regexp", "mask every match of this regular expression (RE2; repeatable; also $IDEMKIT_REDACT_REGEXP)",
		func(s string) error {
			re, err := regexp.Compile(s)
			if err != nil {
				return fmt.Errorf("not a regular expression: %v", err)
			}
			r.regexps = append(r.regexps, re)
			return nil
		})
}

// init completes the redactor after the flags were parsed.
func (r *redactor) init(fs *flag.FlagSet) error {
	redactGiven := false
	fs.Visit(func(f *flag.Flag) { redactGiven = redactGiven || f.Name == "redact" })
	if r.show && redactGiven {
		return usagef("-redact and -show-payload contradict each other (or say the same twice): pass one")
	}
	if fs.Lookup("redact") != nil && !r.redact {
		r.show = true
	}
	r.fields = map[string]bool{}
	for _, list := range []string{strings.Join(sensitiveDefault, ","), r.extra, os.Getenv("IDEMKIT_REDACT_FIELDS")} {
		for _, f := range strings.Split(list, ",") {
			if f = strings.TrimSpace(f); f != "" {
				r.fields[fold(f)] = true
			}
		}
	}
	if env := os.Getenv("IDEMKIT_REDACT_REGEXP"); env != "" {
		re, err := regexp.Compile(env)
		if err != nil {
			return usagef("IDEMKIT_REDACT_REGEXP is not a regular expression: %v", err)
		}
		r.regexps = append(r.regexps, re)
	}
	return nil
}

func fold(name string) string {
	return strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(name))
}

// text masks card-like digit runs and the regexps' matches in s.
func (r *redactor) text(s string) string {
	if r.show {
		return s
	}
	s = maskCards(s)
	for _, re := range r.regexps {
		s = re.ReplaceAllString(s, redactedMark)
	}
	return s
}

// bytes shows b as text: redacted, or with -show-payload verbatim. Bytes
// that are not UTF-8 are shown as their size, or base64 with -show-payload.
func (r *redactor) bytes(b []byte) string {
	switch {
	case utf8.Valid(b):
		return r.text(string(b))
	case r.show:
		return "base64:" + base64.StdEncoding.EncodeToString(b)
	}
	return fmt.Sprintf("(%d bytes, not UTF-8)", len(b))
}

// value shows a message value: a JSON document with its sensitive fields
// masked whole and its strings and numbers as text (compacted, keys
// sorted), anything else as bytes.
func (r *redactor) value(b []byte) string {
	if r.show || len(bytes.TrimSpace(b)) == 0 {
		return r.bytes(b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return r.bytes(b)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r.walk(v)); err != nil {
		return r.bytes(b)
	}
	s := strings.TrimSuffix(out.String(), "\n")
	for _, re := range r.regexps { // field names too
		s = re.ReplaceAllString(s, redactedMark)
	}
	return s
}

func (r *redactor) walk(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			nk := r.text(k) // a field name can hold a card number too
			if r.fields[fold(k)] {
				out[nk] = redactedMark
			} else {
				out[nk] = r.walk(e)
			}
		}
		return out
	case []any:
		for i, e := range v {
			v[i] = r.walk(e)
		}
		return v
	case string:
		return r.text(v)
	case json.Number:
		if m := r.text(v.String()); m != v.String() {
			return m // a masked number becomes a string
		}
		return v
	}
	return v
}

// header shows a header's value: masked whole when its name is sensitive.
func (r *redactor) header(name string, value []byte) string {
	if !r.show && r.fields[fold(name)] {
		return redactedMark
	}
	return r.value(value)
}
