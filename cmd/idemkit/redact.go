package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/idemkit/idemkit/internal/redact"
)

// Redaction: what the commands that show payloads (dlq list, dlq inspect,
// consumer parked list, outbox dead) mask unless -show-payload is given
// (package internal/redact, which the console shares).
// It is the default because these commands run in shells whose output is
// pasted into tickets and chats, and a dead letter is a message that failed:
// often one with data nobody expected (card numbers in a free-text field).
// Masking can over-reach (a 13-digit millisecond timestamp looks like a card
// number); -show-payload shows everything verbatim when that is in the way.

type redactor struct {
	show    bool // -show-payload: nothing is masked
	redact  bool // -redact: the default, said explicitly
	regexps []*regexp.Regexp
	extra   string // -redact-fields
	r       *redact.Redactor
}

// register registers the redaction flags.
func (r *redactor) register(fs *flag.FlagSet) {
	fs.BoolVar(&r.show, "show-payload", false,
		"show keys, values, headers and errors verbatim (by default they are redacted)")
	fs.BoolVar(&r.redact, "redact", true, "redact keys, values, headers and errors (the default; -show-payload turns it off)")
	fs.StringVar(&r.extra, "redact-fields", "",
		"more names (JSON members, form fields, headers) to mask whole, comma-separated (also $IDEMKIT_REDACT_FIELDS; "+
			"always masked: names containing "+strings.Join(redact.SensitiveParts, ", ")+", names ending in key, and "+
			strings.Join(redact.SensitiveDefault, ", ")+")")
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
	if env := os.Getenv("IDEMKIT_REDACT_REGEXP"); env != "" {
		re, err := regexp.Compile(env)
		if err != nil {
			return usagef("IDEMKIT_REDACT_REGEXP is not a regular expression: %v", err)
		}
		r.regexps = append(r.regexps, re)
	}
	fields := strings.Split(r.extra+","+os.Getenv("IDEMKIT_REDACT_FIELDS"), ",")
	r.r = redact.New(fields, r.regexps)
	r.r.Show = r.show
	return nil
}

// core is the redactor init built; before init (in tests), the zero one.
func (r *redactor) core() *redact.Redactor {
	if r.r == nil {
		r.r = &redact.Redactor{Show: r.show}
	}
	return r.r
}

func (r *redactor) text(s string) string                { return r.core().Text(s) }
func (r *redactor) bytes(b []byte) string               { return r.core().Bytes(b) }
func (r *redactor) value(b []byte) string               { return r.core().Value(b) }
func (r *redactor) header(name string, v []byte) string { return r.core().Header(name, v) }
