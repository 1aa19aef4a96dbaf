package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalidJSON matches (with errors.Is) every error CanonicalJSON returns,
// and the error a request gets when its JSON body cannot be canonicalised.
var ErrInvalidJSON = errors.New("idemhttp: invalid JSON")

// Limits of CanonicalJSON.
const (
	// MaxJSONDepth is the deepest nesting of arrays and objects accepted.
	MaxJSONDepth = 512
	// MaxJSONExponentDigits is the most significant digits a number's
	// exponent may have (1e999999999999999 is accepted, a longer exponent is
	// not): it keeps the exact normalisation of numbers cheap.
	MaxJSONExponentDigits = 15
)

// jsonSyntaxError is what the parser returns; it matches ErrInvalidJSON.
type jsonSyntaxError struct {
	offset int
	msg    string
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("idemhttp: invalid JSON at byte %d: %s", e.offset, e.msg)
}

func (e *jsonSyntaxError) Is(target error) bool { return target == ErrInvalidJSON }

// CanonicalJSON returns the canonical form of one JSON value (RFC 8259), so
// that two documents meaning the same value have byte-equal canonical forms
// and two documents meaning different values do not:
//
//   - no insignificant whitespace;
//   - object members sorted by the bytes of their UTF-8 names (which is
//     Unicode code point order);
//   - strings with their escapes resolved and re-escaped one way only: '"',
//     '\' and control characters are escaped (\b \t \n \f \r, else \u00XX),
//     everything else is literal UTF-8;
//   - numbers by exact decimal value: 1, 1.0, 1e0, 10e-1 and 0.1e1 are one
//     number, written as an integer when it is one of at most 21 digits,
//     as a plain decimal when it has at most 6 leading fractional zeros, else
//     in exponent form (1e+30, 1.5e-7); -0 is 0. Values are never rounded
//     to float64: 0.1 and 0.10000000000000001 stay different.
//
// It rejects, with an error matching ErrInvalidJSON: anything that is not
// exactly one JSON value (surrounding whitespace allowed), invalid UTF-8,
// unpaired UTF-16 surrogate escapes, duplicate member names in one object,
// also names that differ only in case as encoding/json folds them
// ("amount" and "Amount": which one a handler reads is ambiguous), nesting deeper than MaxJSONDepth, and
// exponents longer than MaxJSONExponentDigits significant digits.
func CanonicalJSON(data []byte) ([]byte, error) {
	v, err := parseJSON(data)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(len(data))
	v.writeCanonical(&b)
	return b.Bytes(), nil
}

// foldName returns name folded as encoding/json matches member names to
// struct fields: two names are equal once folded exactly when
// encoding/json takes one for the other (ASCII letters and Unicode simple
// case folding).
func foldName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	for _, r := range name {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			b.WriteByte(byte(r))
			continue
		}
		b.WriteRune(foldRune(r))
	}
	return b.String()
}

// foldRune returns the smallest rune of r's simple case folding orbit.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// jsonKind is the type of a parsed JSON value.
type jsonKind uint8

const (
	kindNull jsonKind = iota
	kindFalse
	kindTrue
	kindNumber
	kindString
	kindArray
	kindObject
)

// jsonValue is a parsed JSON value. Numbers hold their canonical text,
// strings their decoded text, objects their members sorted by name.
type jsonValue struct {
	kind    jsonKind
	text    string // number (canonical) or string (decoded)
	items   []jsonValue
	members []jsonMember
}

type jsonMember struct {
	name  string
	value jsonValue
}

func parseJSON(data []byte) (jsonValue, error) {
	if !utf8.Valid(data) {
		return jsonValue{}, &jsonSyntaxError{offset: invalidUTF8Offset(data), msg: "invalid UTF-8"}
	}
	p := &jsonParser{data: data}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return jsonValue{}, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return jsonValue{}, p.errorf("data after the JSON value")
	}
	return v, nil
}

func invalidUTF8Offset(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(data)
}

type jsonParser struct {
	data []byte
	pos  int
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return &jsonSyntaxError{offset: p.pos, msg: fmt.Sprintf(format, args...)}
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (jsonValue, error) {
	if p.pos >= len(p.data) {
		return jsonValue{}, p.errorf("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		return jsonValue{kind: kindString, text: s}, err
	case c == '-' || (c >= '0' && c <= '9'):
		n, err := p.number()
		return jsonValue{kind: kindNumber, text: n}, err
	case c == 't':
		return jsonValue{kind: kindTrue}, p.literal("true")
	case c == 'f':
		return jsonValue{kind: kindFalse}, p.literal("false")
	case c == 'n':
		return jsonValue{kind: kindNull}, p.literal("null")
	default:
		return jsonValue{}, p.errorf("unexpected character %q", c)
	}
}

func (p *jsonParser) literal(word string) error {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(word)) {
		return p.errorf("invalid literal, want %s", word)
	}
	p.pos += len(word)
	return nil
}

func (p *jsonParser) object(depth int) (jsonValue, error) {
	if depth > MaxJSONDepth {
		return jsonValue{}, p.errorf("nested deeper than %d", MaxJSONDepth)
	}
	p.pos++ // {
	v := jsonValue{kind: kindObject}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return jsonValue{}, p.errorf("want a member name")
		}
		name, err := p.string()
		if err != nil {
			return jsonValue{}, err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return jsonValue{}, p.errorf("want ':' after a member name")
		}
		p.pos++
		p.skipSpace()
		member, err := p.value(depth)
		if err != nil {
			return jsonValue{}, err
		}
		v.members = append(v.members, jsonMember{name: name, value: member})
		p.skipSpace()
		if p.pos >= len(p.data) {
			return jsonValue{}, p.errorf("unexpected end of input in an object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			continue
		case '}':
			p.pos++
		default:
			return jsonValue{}, p.errorf("want ',' or '}' in an object")
		}
		break
	}
	slices.SortFunc(v.members, func(a, b jsonMember) int { return strings.Compare(a.name, b.name) })
	for i := 1; i < len(v.members); i++ {
		if v.members[i].name == v.members[i-1].name {
			return jsonValue{}, p.errorf("duplicate member name %q", v.members[i].name)
		}
	}
	if len(v.members) > 1 {
		folded := make([]string, len(v.members))
		for i := range v.members {
			folded[i] = foldName(v.members[i].name)
		}
		slices.Sort(folded)
		for i := 1; i < len(folded); i++ {
			if folded[i] == folded[i-1] {
				return jsonValue{}, p.errorf("member names equal but for case (%q): encoding/json may read either", folded[i])
			}
		}
	}
	return v, nil
}

func (p *jsonParser) array(depth int) (jsonValue, error) {
	if depth > MaxJSONDepth {
		return jsonValue{}, p.errorf("nested deeper than %d", MaxJSONDepth)
	}
	p.pos++ // [
	v := jsonValue{kind: kindArray}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		item, err := p.value(depth)
		if err != nil {
			return jsonValue{}, err
		}
		v.items = append(v.items, item)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return jsonValue{}, p.errorf("unexpected end of input in an array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			continue
		case ']':
			p.pos++
		default:
			return jsonValue{}, p.errorf("want ',' or ']' in an array")
		}
		return v, nil
	}
}

// string parses a JSON string at p.pos and returns its decoded text.
func (p *jsonParser) string() (string, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			s := string(p.data[start:p.pos])
			p.pos++
			return s, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.errorf("control character in a string")
		}
		p.pos++
	}
	var b strings.Builder
	b.Write(p.data[start:p.pos])
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return b.String(), nil
		case c < 0x20:
			return "", p.errorf("control character in a string")
		case c != '\\':
			b.WriteByte(c)
			p.pos++
			continue
		}
		// An escape.
		if p.pos+1 >= len(p.data) {
			break
		}
		e := p.data[p.pos+1]
		p.pos += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return "", err
			}
			switch {
			case utf16.IsSurrogate(r) && r < 0xDC00: // high surrogate: a low one must follow
				if p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
					return "", p.errorf("unpaired UTF-16 surrogate")
				}
				p.pos += 2
				low, err := p.hex4()
				if err != nil {
					return "", err
				}
				if low < 0xDC00 || low > 0xDFFF {
					return "", p.errorf("unpaired UTF-16 surrogate")
				}
				r = utf16.DecodeRune(r, low)
			case utf16.IsSurrogate(r):
				return "", p.errorf("unpaired UTF-16 surrogate")
			}
			b.WriteRune(r)
		default:
			return "", p.errorf("invalid escape \\%c", e)
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *jsonParser) hex4() (rune, error) {
	if p.pos+4 > len(p.data) {
		return 0, p.errorf("short \\u escape")
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, p.errorf("invalid \\u escape")
		}
	}
	p.pos += 4
	return r, nil
}

// number parses a JSON number at p.pos and returns its canonical text.
func (p *jsonParser) number() (string, error) {
	start := p.pos
	neg := false
	if p.data[p.pos] == '-' {
		neg = true
		p.pos++
	}
	digitsFrom := func() int {
		from := p.pos
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
		}
		return from
	}
	intStart := digitsFrom()
	intPart := p.data[intStart:p.pos]
	if len(intPart) == 0 {
		return "", p.errorf("want a digit")
	}
	if len(intPart) > 1 && intPart[0] == '0' {
		return "", &jsonSyntaxError{offset: intStart, msg: "leading zero in a number"}
	}
	var fracPart []byte
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		fracStart := digitsFrom()
		fracPart = p.data[fracStart:p.pos]
		if len(fracPart) == 0 {
			return "", p.errorf("want a digit after '.'")
		}
	}
	var exp int64
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		expNeg := false
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			expNeg = p.data[p.pos] == '-'
			p.pos++
		}
		expStart := digitsFrom()
		expDigits := bytes.TrimLeft(p.data[expStart:p.pos], "0")
		if p.pos == expStart {
			return "", p.errorf("want a digit in the exponent")
		}
		if len(expDigits) > MaxJSONExponentDigits {
			return "", &jsonSyntaxError{offset: start, msg: fmt.Sprintf("exponent longer than %d digits", MaxJSONExponentDigits)}
		}
		if len(expDigits) > 0 {
			e, err := strconv.ParseInt(string(expDigits), 10, 64)
			if err != nil { // cannot happen with at most 15 digits
				return "", &jsonSyntaxError{offset: start, msg: "invalid exponent"}
			}
			exp = e
		}
		if expNeg {
			exp = -exp
		}
	}
	return canonicalNumber(neg, intPart, fracPart, exp), nil
}

// canonicalNumber writes the exact value sign × int.frac × 10^exp in one
// form per value.
func canonicalNumber(neg bool, intPart, fracPart []byte, exp int64) string {
	// value = digits × 10^e, digits without leading or trailing zeros.
	digits := make([]byte, 0, len(intPart)+len(fracPart))
	digits = append(digits, intPart...)
	digits = append(digits, fracPart...)
	e := exp - int64(len(fracPart))
	i := 0
	for i < len(digits) && digits[i] == '0' {
		i++
	}
	digits = digits[i:]
	if len(digits) == 0 {
		return "0" // also -0
	}
	j := len(digits)
	for digits[j-1] == '0' {
		j--
	}
	e += int64(len(digits) - j)
	digits = digits[:j]

	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	n := int64(len(digits))
	point := n + e // position of the decimal point from the first digit
	switch {
	case e >= 0 && point <= 21:
		b.Write(digits)
		b.WriteString(strings.Repeat("0", int(e)))
	case e < 0 && point > 0:
		b.Write(digits[:point])
		b.WriteByte('.')
		b.Write(digits[point:])
	case e < 0 && point > -6:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", int(-point)))
		b.Write(digits)
	default:
		b.WriteByte(digits[0])
		if n > 1 {
			b.WriteByte('.')
			b.Write(digits[1:])
		}
		b.WriteByte('e')
		if point-1 >= 0 {
			b.WriteByte('+')
		}
		b.WriteString(strconv.FormatInt(point-1, 10))
	}
	return b.String()
}

func (v *jsonValue) writeCanonical(b *bytes.Buffer) {
	switch v.kind {
	case kindNull:
		b.WriteString("null")
	case kindFalse:
		b.WriteString("false")
	case kindTrue:
		b.WriteString("true")
	case kindNumber:
		b.WriteString(v.text)
	case kindString:
		writeCanonicalString(b, v.text)
	case kindArray:
		b.WriteByte('[')
		for i := range v.items {
			if i > 0 {
				b.WriteByte(',')
			}
			v.items[i].writeCanonical(b)
		}
		b.WriteByte(']')
	case kindObject:
		b.WriteByte('{')
		for i := range v.members {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonicalString(b, v.members[i].name)
			b.WriteByte(':')
			v.members[i].value.writeCanonical(b)
		}
		b.WriteByte('}')
	}
}

func writeCanonicalString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\b':
			b.WriteString(`\b`)
		case c == '\t':
			b.WriteString(`\t`)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\f':
			b.WriteString(`\f`)
		case c == '\r':
			b.WriteString(`\r`)
		case c < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xF])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// lookup returns the value at an RFC 6901 JSON Pointer ("" is the whole
// value, "/a/0/b~1c" the member "b/c" of the first item of member "a").
func (v *jsonValue) lookup(pointer string) (*jsonValue, bool) {
	if pointer == "" {
		return v, true
	}
	cur := v
	for _, tok := range strings.Split(pointer[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch cur.kind {
		case kindObject:
			i, ok := slices.BinarySearchFunc(cur.members, tok, func(m jsonMember, name string) int {
				return strings.Compare(m.name, name)
			})
			if !ok {
				return nil, false
			}
			cur = &cur.members[i].value
		case kindArray:
			if tok == "" || (len(tok) > 1 && tok[0] == '0') {
				return nil, false
			}
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(cur.items) {
				return nil, false
			}
			cur = &cur.items[i]
		default:
			return nil, false
		}
	}
	return cur, true
}
