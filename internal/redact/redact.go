// Package redact masks what payloads and error texts may carry that must
// not reach a terminal, a ticket or a browser unasked: payment card numbers
// (every digit but the last four), the values of sensitive names (JSON
// members, form fields, XML elements, headers, name=value pairs), token
// shapes (JWTs, provider API keys, Authorization credentials) and the
// caller's regular expressions. The idemkit command and the console redact
// with it, so that both show a payload the same way.
//
// Masking can over-reach (a 13-digit millisecond timestamp looks like a
// card number); Show turns it off.
package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Mark replaces what is masked whole.
const Mark = "***"

// SensitiveDefault are the names (JSON members, form fields, XML elements,
// header names, key=value pairs in error texts) whose values New masks
// whole, compared folded (fold: without case, '-', '_', '.' and spaces).
var SensitiveDefault = []string{
	"card", "pan", "cvv2", "expiry", "exp_month", "exp_year", "account_number", "ssn", "pin", "pwd", "otp", "auth",
}

// SensitiveParts mask a name that contains one of them, folded:
// "newPassword", "client_secret", "id_token", "X-Auth-Token",
// "Proxy-Authorization", "aws_access_key_id"; and so does a name that ends
// in "key" ("stripe_key", "X-Api-Key", "private_key").
var SensitiveParts = []string{
	"password", "passwd", "passphrase", "secret", "token", "apikey", "accesskey", "privatekey", "authorization",
	"cookie", "credential", "cardnumber", "cvv", "cvc", "iban", "sessionid", "signature",
}

// Redactor masks texts, values and headers. The zero value masks card
// numbers, token shapes and the names of SensitiveParts; New adds
// SensitiveDefault and the caller's names. It is safe for concurrent use
// once built.
type Redactor struct {
	// Show turns masking off: everything is shown verbatim (bytes that are
	// not UTF-8 as base64).
	Show    bool
	fields  map[string]bool
	regexps []*regexp.Regexp
}

// New returns a Redactor that also masks the values named by
// SensitiveDefault and fields, and every match of regexps.
func New(fields []string, regexps []*regexp.Regexp) *Redactor {
	r := &Redactor{fields: map[string]bool{}, regexps: regexps}
	for _, f := range append(slices.Clone(SensitiveDefault), fields...) {
		if f = strings.TrimSpace(f); f != "" {
			r.fields[fold(f)] = true
		}
	}
	return r
}

// MaskCards masks payment card numbers (PANs) in s, every digit but the
// last four: every run of 13 to 19 digits, and in a longer run every
// stretch of 13 to 19 digits that starts with 2 to 6 and passes the Luhn
// check. Digits of a run may be grouped by up to three separators (space,
// '-', '.', '/', '_', '+', ':') or one %XX escape ("4111%201111…"), and a
// run may touch letters ("card_4111…", "pan4111…"): no word boundary is
// needed.
func MaskCards(s string) string {
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	isSep := func(c byte) bool { return strings.IndexByte(" -./_+:", c) >= 0 }
	isHex := func(c byte) bool { return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'f') }
	b := []byte(s)
	var pos []int
	for i := 0; i < len(b); {
		if !isDigit(b[i]) {
			i++
			continue
		}
		pos = pos[:0]
		j := i
		for j < len(b) {
			if isDigit(b[j]) {
				pos = append(pos, j)
				j++
				continue
			}
			k := j
			if b[k] == '%' && k+3 < len(b) && isHex(b[k+1]) && isHex(b[k+2]) {
				k += 3
			} else {
				for k < len(b) && k-j < 3 && isSep(b[k]) {
					k++
				}
			}
			if k == j || k >= len(b) || !isDigit(b[k]) {
				break
			}
			j = k
		}
		mask := func(ds []int) {
			for _, p := range ds[:len(ds)-4] {
				b[p] = '*'
			}
		}
		switch n := len(pos); {
		case n >= 13 && n <= 19:
			mask(pos)
		case n > 19:
			for a := 0; a+13 <= n; a++ {
				if b[pos[a]] < '2' || b[pos[a]] > '6' {
					continue
				}
				for l := 19; l >= 13; l-- {
					if a+l <= n && luhn(b, pos[a:a+l]) {
						mask(pos[a : a+l])
						a += l - 1
						break
					}
				}
			}
		}
		i = j
	}
	return string(b)
}

// luhn reports whether the digits of b at pos pass the Luhn check.
func luhn(b []byte, pos []int) bool {
	sum := 0
	for i := range pos {
		d := int(b[pos[len(pos)-1-i]] - '0')
		if i%2 == 1 {
			if d *= 2; d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return sum%10 == 0
}

func fold(name string) string {
	return strings.NewReplacer("-", "", "_", "", ".", "", " ", "").Replace(strings.ToLower(name))
}

// sensitive reports whether values named name are masked whole.
func (r *Redactor) sensitive(name string) bool {
	f := fold(name)
	if f == "" {
		return false
	}
	if r.fields[f] || strings.HasSuffix(f, "key") {
		return true
	}
	for _, p := range SensitiveParts {
		if strings.Contains(f, p) {
			return true
		}
	}
	return false
}

// tokenShapes are secrets recognised by their shape wherever they are:
// JWTs, provider API keys, and the credentials of Authorization headers.
var tokenShapes = []*regexp.Regexp{
	regexp.MustCompile(`eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*`),
	regexp.MustCompile(`\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]+`),
	regexp.MustCompile(`\bAKIA[0-9A-Z]{16}\b`),
	regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{20,}`),
	regexp.MustCompile(`\bxox[abprs]-[A-Za-z0-9-]{10,}`),
}

// authScheme is an Authorization credential: the scheme stays, the rest goes.
var authScheme = regexp.MustCompile(`(?i)\b(Bearer|Basic|Digest|Token)\s+[A-Za-z0-9._~+/=-]+`)

// namedValue is a name and its value in text: name=value, name: value,
// "name": "value" (also truncated, without the closing quote), in error
// texts, form bodies, JSON that does not parse and headers in text.
var namedValue = regexp.MustCompile(`([A-Za-z0-9_.\-]+)(\\?"?'?\s*[:=]\s*)("(?:[^"\\]|\\.)*"?|'[^']*'?|\\"(?:[^"\\]|\\[^"])*(?:\\")?|[^\s"'&,;}<\]]+)`)

// xmlElement is the start of an XML element and its text.
var xmlElement = regexp.MustCompile(`<([A-Za-z_][A-Za-z0-9_.:-]*)(\s[^>]*)?>([^<]*)`)

// maskNamed masks the values of sensitive names in text s.
func (r *Redactor) maskNamed(s string) string {
	s = namedValue.ReplaceAllStringFunc(s, func(m string) string {
		sub := namedValue.FindStringSubmatch(m)
		if !r.sensitive(sub[1]) {
			return m
		}
		return sub[1] + sub[2] + Mark
	})
	return xmlElement.ReplaceAllStringFunc(s, func(m string) string {
		sub := xmlElement.FindStringSubmatch(m)
		if !r.sensitive(sub[1]) || sub[3] == "" {
			return m
		}
		return strings.TrimSuffix(m, sub[3]) + Mark
	})
}

// Text masks, in s: JSON in it (a string holding a document), the values
// of sensitive names (name=value, "name": "value", <name>value), token
// shapes (JWTs, API keys, Authorization credentials), card numbers, and the
// regexps' matches.
func (r *Redactor) Text(s string) string {
	if r.Show {
		return s
	}
	if t := strings.TrimSpace(s); len(t) > 1 && (t[0] == '{' || t[0] == '[') {
		if v, ok := r.document([]byte(t)); ok {
			return v
		}
	}
	s = authScheme.ReplaceAllString(s, "$1 "+Mark)
	s = r.maskNamed(s)
	for _, re := range tokenShapes {
		s = re.ReplaceAllString(s, Mark)
	}
	s = MaskCards(s)
	for _, re := range r.regexps {
		s = re.ReplaceAllString(s, Mark)
	}
	return s
}

// Bytes shows b as text: redacted, or with Show verbatim. Bytes
// that are not UTF-8 are shown as their size, or base64 with Show.
func (r *Redactor) Bytes(b []byte) string {
	switch {
	case utf8.Valid(b):
		return r.Text(string(b))
	case r.Show:
		return "base64:" + base64.StdEncoding.EncodeToString(b)
	}
	return fmt.Sprintf("(%d bytes, not UTF-8)", len(b))
}

// Value shows a message value: JSON documents (one, or one per line; a
// byte order mark ignored) with their sensitive members masked whole and
// their strings and numbers as text (compacted, keys sorted); anything else
// (a form body, XML, JSON cut short) as text.
func (r *Redactor) Value(b []byte) string {
	if r.Show || len(bytes.TrimSpace(b)) == 0 {
		return r.Bytes(b)
	}
	b = bytes.TrimPrefix(b, []byte("\ufeff"))
	if s, ok := r.document(b); ok {
		return s
	}
	if lines := bytes.Split(bytes.TrimSpace(b), []byte("\n")); len(lines) > 1 {
		out := make([]string, 0, len(lines))
		for _, l := range lines {
			s, ok := r.document(l)
			if !ok {
				out = nil
				break
			}
			out = append(out, s)
		}
		if out != nil {
			return strings.Join(out, "\n")
		}
	}
	return r.Bytes(b)
}

// document redacts b when it is one JSON document.
func (r *Redactor) document(b []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return "", false
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r.walk(v)); err != nil {
		return "", false
	}
	s := strings.TrimSuffix(out.String(), "\n")
	for _, re := range r.regexps { // field names too
		s = re.ReplaceAllString(s, Mark)
	}
	return s, true
}

func (r *Redactor) walk(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			nk := r.Text(k) // a field name can hold a card number too
			if r.sensitive(k) {
				out[nk] = Mark
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
		return r.Text(v)
	case json.Number:
		if m := r.Text(v.String()); m != v.String() {
			return m // a masked number becomes a string
		}
		return v
	}
	return v
}

// Header shows a header's value: masked whole when its name is sensitive.
func (r *Redactor) Header(name string, value []byte) string {
	if !r.Show && r.sensitive(name) {
		return Mark
	}
	return r.Value(value)
}
