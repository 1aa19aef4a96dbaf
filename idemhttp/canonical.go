package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"math"
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
	// MaxJSONValues is the most values one document may hold, array items
	// and members' values included: it bounds the work per request whatever
	// Config.MaxRequestBytes allows (a 1 MiB body holds at most about
	// 520,000).
	MaxJSONValues = 1 << 20
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
// exponents longer than MaxJSONExponentDigits significant digits, and more
// than MaxJSONValues values.
//
// It works in one pass, writing the canonical form as it reads: the memory
// it takes is the canonical form (at most a few times the input, for
// numbers such as 1e20 written out) plus a few words per member of the
// objects open at a time, whatever the shape of the document.
func CanonicalJSON(data []byte) ([]byte, error) {
	p, err := canonicalize(data)
	if err != nil {
		return nil, err
	}
	return p.out, nil
}

// canonicalize parses data and writes its canonical form to the returned
// parser's out.
func canonicalize(data []byte) (*jsonParser, error) {
	if !utf8.Valid(data) {
		return nil, &jsonSyntaxError{offset: invalidUTF8Offset(data), msg: "invalid UTF-8"}
	}
	p := &jsonParser{data: data, out: make([]byte, 0, len(data))}
	p.skipSpace()
	if err := p.value(0); err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.errorf("data after the JSON value")
	}
	return p, nil
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

// jsonParser reads data and writes its canonical form to out as it goes.
type jsonParser struct {
	data   []byte
	pos    int
	out    []byte
	values int
	// members holds the members of the objects open, innermost last: each
	// its span in out, so that an object's members are sorted once it ends.
	members []memberSpan
	// scratch is reused by every object's sort.
	scratch []byte
}

// memberSpan is a member written to out: its name is out[start:colon], a
// canonical string with its quotes, and its value out[colon+1:end]. plain
// is true when the name is ASCII without escapes (most are), so that it
// compares as bytes. Offsets are 32 bits: canonicalize refuses a longer
// canonical form.
type memberSpan struct {
	start, colon, end int32
	plain             bool
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

func (p *jsonParser) value(depth int) error {
	if p.pos >= len(p.data) {
		return p.errorf("unexpected end of input")
	}
	if p.values++; p.values > MaxJSONValues {
		return p.errorf("more than %d values", MaxJSONValues)
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		return p.string()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	default:
		return p.errorf("unexpected character %q", c)
	}
}

func (p *jsonParser) literal(word string) error {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(word)) {
		return p.errorf("invalid literal, want %s", word)
	}
	p.pos += len(word)
	p.out = append(p.out, word...)
	return nil
}

func (p *jsonParser) object(depth int) error {
	if depth > MaxJSONDepth {
		return p.errorf("nested deeper than %d", MaxJSONDepth)
	}
	p.pos++ // {
	p.out = append(p.out, '{')
	first := len(p.members)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		p.out = append(p.out, '}')
		return nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return p.errorf("want a member name")
		}
		if len(p.members) > first {
			p.out = append(p.out, ',')
		}
		start := len(p.out)
		if err := p.string(); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return p.errorf("want ':' after a member name")
		}
		p.pos++
		colon := len(p.out)
		p.out = append(p.out, ':')
		p.skipSpace()
		if err := p.value(depth); err != nil {
			return err
		}
		if len(p.out) > math.MaxInt32 {
			return p.errorf("canonical form longer than %d bytes", math.MaxInt32)
		}
		plain := true
		for _, c := range p.out[start+1 : colon-1] {
			if c == '\\' || c >= utf8.RuneSelf {
				plain = false
				break
			}
		}
		p.members = append(p.members, memberSpan{start: int32(start), colon: int32(colon), end: int32(len(p.out)),
			plain: plain})
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.errorf("unexpected end of input in an object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			continue
		case '}':
			p.pos++
		default:
			return p.errorf("want ',' or '}' in an object")
		}
		break
	}
	err := p.sortMembers(p.members[first:])
	p.members = p.members[:first]
	p.out = append(p.out, '}')
	return err
}

// sortMembers puts the members ms of the object being closed (the end of
// out) in the order of their names, and refuses names that are equal, or
// equal as encoding/json folds them.
func (p *jsonParser) sortMembers(ms []memberSpan) error {
	if len(ms) < 2 {
		return nil
	}
	name := func(m memberSpan) []byte { return p.out[m.start:m.colon] }
	exact := func(a, b memberSpan) int {
		if a.plain && b.plain {
			return bytes.Compare(name(a), name(b)) // same order: '"' ends both
		}
		return compareNames(name(a), name(b))
	}
	folded := func(a, b memberSpan) int {
		if a.plain && b.plain {
			return compareFoldedASCII(name(a), name(b))
		}
		return compareFolded(name(a), name(b))
	}
	sorted := slices.IsSortedFunc(ms, exact)
	slices.SortFunc(ms, folded)
	for i := 1; i < len(ms); i++ {
		if folded(ms[i-1], ms[i]) == 0 {
			a, b := name(ms[i-1]), name(ms[i])
			if bytes.Equal(a, b) {
				return p.errorf("duplicate member name %s", a)
			}
			return p.errorf("member names %s and %s equal but for case: encoding/json may read either", a, b)
		}
	}
	if sorted {
		return nil
	}
	slices.SortFunc(ms, exact)
	// Rewrite the object's members in that order: out[base:] holds them,
	// separated by commas.
	base := int(ms[0].start)
	for _, m := range ms {
		base = min(base, int(m.start))
	}
	p.scratch = append(p.scratch[:0], p.out[base:]...)
	p.out = p.out[:base]
	for i, m := range ms {
		if i > 0 {
			p.out = append(p.out, ',')
		}
		p.out = append(p.out, p.scratch[int(m.start)-base:int(m.end)-base]...)
	}
	return nil
}

// nameByte returns the byte at i of a canonical string's decoded text (s
// with its quotes: i starts at 1) and the index of the next, or -1 at the
// closing quote. The canonical form escapes '"', '\\' and control
// characters only, each as one ASCII byte.
func nameByte(s []byte, i int) (byte, int) {
	c := s[i]
	switch {
	case c == '"':
		return 0, -1
	case c != '\\':
		return c, i + 1
	}
	switch s[i+1] {
	case 'b':
		return '\b', i + 2
	case 't':
		return '\t', i + 2
	case 'n':
		return '\n', i + 2
	case 'f':
		return '\f', i + 2
	case 'r':
		return '\r', i + 2
	case 'u': // \u00XX
		return unhex(s[i+4])<<4 | unhex(s[i+5]), i + 6
	}
	return s[i+1], i + 2 // '"' or '\\'
}

func unhex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

// compareNames compares two canonical strings by the bytes of their
// decoded UTF-8 text (which is Unicode code point order).
func compareNames(a, b []byte) int {
	i, j := 1, 1
	for {
		var ca, cb byte
		ca, i = nameByte(a, i)
		cb, j = nameByte(b, j)
		switch {
		case i < 0 && j < 0:
			return 0
		case i < 0:
			return -1
		case j < 0:
			return 1
		case ca != cb:
			return int(ca) - int(cb)
		}
	}
}

// compareFolded compares two canonical strings by their decoded text folded
// as encoding/json folds member names (foldName): 0 when encoding/json takes
// one for the other.
func compareFolded(a, b []byte) int {
	i, j := 1, 1
	for {
		var ra, rb rune
		ra, i = nameRune(a, i)
		rb, j = nameRune(b, j)
		switch {
		case i < 0 && j < 0:
			return 0
		case i < 0:
			return -1
		case j < 0:
			return 1
		}
		if fa, fb := foldRuneJSON(ra), foldRuneJSON(rb); fa != fb {
			return int(fa - fb)
		}
	}
}

// compareFoldedASCII is compareFolded for ASCII names without escapes.
func compareFoldedASCII(a, b []byte) int {
	for i := 1; ; i++ {
		ca, cb := a[i], b[i]
		if 'a' <= ca && ca <= 'z' {
			ca -= 'a' - 'A'
		}
		if 'a' <= cb && cb <= 'z' {
			cb -= 'a' - 'A'
		}
		switch {
		case ca == cb && ca == '"':
			return 0
		case ca == '"':
			return -1
		case cb == '"':
			return 1
		case ca != cb:
			return int(ca) - int(cb)
		}
	}
}

// nameRune is nameByte by runes: escapes are ASCII, other bytes UTF-8.
func nameRune(s []byte, i int) (rune, int) {
	if s[i] == '"' || s[i] == '\\' || s[i] < utf8.RuneSelf {
		c, next := nameByte(s, i)
		return rune(c), next
	}
	r, n := utf8.DecodeRune(s[i:])
	return r, i + n
}

// foldRuneJSON folds one rune as foldName does.
func foldRuneJSON(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	return foldRune(r)
}

func (p *jsonParser) array(depth int) error {
	if depth > MaxJSONDepth {
		return p.errorf("nested deeper than %d", MaxJSONDepth)
	}
	p.pos++ // [
	p.out = append(p.out, '[')
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.out = append(p.out, ']')
		return nil
	}
	for n := 0; ; n++ {
		p.skipSpace()
		if n > 0 {
			p.out = append(p.out, ',')
		}
		if err := p.value(depth); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.errorf("unexpected end of input in an array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			continue
		case ']':
			p.pos++
		default:
			return p.errorf("want ',' or ']' in an array")
		}
		p.out = append(p.out, ']')
		return nil
	}
}

// string parses a JSON string at p.pos and appends its canonical form:
// escapes resolved, and '"', '\\' and control characters escaped one way.
func (p *jsonParser) string() error {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes; the bytes are already canonical.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			p.out = append(p.out, '"')
			p.out = append(p.out, p.data[start:p.pos]...)
			p.out = append(p.out, '"')
			p.pos++
			return nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return p.errorf("control character in a string")
		}
		p.pos++
	}
	p.out = append(p.out, '"')
	p.out = append(p.out, p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			p.out = append(p.out, '"')
			return nil
		case c < 0x20:
			return p.errorf("control character in a string")
		case c != '\\':
			p.out = append(p.out, c)
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
			p.out = appendCanonicalByte(p.out, e)
		case 'b':
			p.out = appendCanonicalByte(p.out, '\b')
		case 'f':
			p.out = appendCanonicalByte(p.out, '\f')
		case 'n':
			p.out = appendCanonicalByte(p.out, '\n')
		case 'r':
			p.out = appendCanonicalByte(p.out, '\r')
		case 't':
			p.out = appendCanonicalByte(p.out, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return err
			}
			switch {
			case utf16.IsSurrogate(r) && r < 0xDC00: // high surrogate: a low one must follow
				if p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
					return p.errorf("unpaired UTF-16 surrogate")
				}
				p.pos += 2
				low, err := p.hex4()
				if err != nil {
					return err
				}
				if low < 0xDC00 || low > 0xDFFF {
					return p.errorf("unpaired UTF-16 surrogate")
				}
				r = utf16.DecodeRune(r, low)
			case utf16.IsSurrogate(r):
				return p.errorf("unpaired UTF-16 surrogate")
			}
			if r < utf8.RuneSelf {
				p.out = appendCanonicalByte(p.out, byte(r))
			} else {
				p.out = utf8.AppendRune(p.out, r)
			}
		default:
			return p.errorf("invalid escape \\%c", e)
		}
	}
	return p.errorf("unterminated string")
}

// appendCanonicalByte appends one ASCII byte of a string's text in its
// canonical form.
func appendCanonicalByte(out []byte, c byte) []byte {
	const hex = "0123456789abcdef"
	switch {
	case c == '"' || c == '\\':
		return append(out, '\\', c)
	case c == '\b':
		return append(out, '\\', 'b')
	case c == '\t':
		return append(out, '\\', 't')
	case c == '\n':
		return append(out, '\\', 'n')
	case c == '\f':
		return append(out, '\\', 'f')
	case c == '\r':
		return append(out, '\\', 'r')
	case c < 0x20:
		return append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
	}
	return append(out, c)
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

// number parses a JSON number at p.pos and appends its canonical text.
func (p *jsonParser) number() error {
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
		return p.errorf("want a digit")
	}
	if len(intPart) > 1 && intPart[0] == '0' {
		return &jsonSyntaxError{offset: intStart, msg: "leading zero in a number"}
	}
	var fracPart []byte
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		fracStart := digitsFrom()
		fracPart = p.data[fracStart:p.pos]
		if len(fracPart) == 0 {
			return p.errorf("want a digit after '.'")
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
			return p.errorf("want a digit in the exponent")
		}
		if len(expDigits) > MaxJSONExponentDigits {
			return &jsonSyntaxError{offset: start, msg: fmt.Sprintf("exponent longer than %d digits", MaxJSONExponentDigits)}
		}
		if len(expDigits) > 0 {
			e, err := strconv.ParseInt(string(expDigits), 10, 64)
			if err != nil { // cannot happen with at most 15 digits
				return &jsonSyntaxError{offset: start, msg: "invalid exponent"}
			}
			exp = e
		}
		if expNeg {
			exp = -exp
		}
	}
	p.out = appendCanonicalNumber(p.out, neg, intPart, fracPart, exp)
	return nil
}

// appendCanonicalNumber appends the exact value sign × int.frac × 10^exp
// in one form per value.
func appendCanonicalNumber(out []byte, neg bool, intPart, fracPart []byte, exp int64) []byte {
	// value = digits × 10^e, digits (int then frac) without leading or
	// trailing zeros: digit(k) for k in [from, to).
	digit := func(k int) byte {
		if k < len(intPart) {
			return intPart[k]
		}
		return fracPart[k-len(intPart)]
	}
	total := len(intPart) + len(fracPart)
	e := exp - int64(len(fracPart))
	from := 0
	for from < total && digit(from) == '0' {
		from++
	}
	if from == total {
		return append(out, '0') // also -0
	}
	to := total
	for digit(to-1) == '0' {
		to--
	}
	e += int64(total - to)
	digits := func(out []byte, a, b int) []byte {
		for k := a; k < b; k++ {
			out = append(out, digit(from+k))
		}
		return out
	}
	if neg {
		out = append(out, '-')
	}
	n := int64(to - from)
	point := n + e // position of the decimal point from the first digit
	switch {
	case e >= 0 && point <= 21:
		out = digits(out, 0, int(n))
		for range e {
			out = append(out, '0')
		}
	case e < 0 && point > 0:
		out = digits(out, 0, int(point))
		out = append(out, '.')
		out = digits(out, int(point), int(n))
	case e < 0 && point > -6:
		out = append(out, '0', '.')
		for range -point {
			out = append(out, '0')
		}
		out = digits(out, 0, int(n))
	default:
		out = digits(out, 0, 1)
		if n > 1 {
			out = append(out, '.')
			out = digits(out, 1, int(n))
		}
		out = append(out, 'e')
		if point-1 >= 0 {
			out = append(out, '+')
		}
		out = strconv.AppendInt(out, point-1, 10)
	}
	return out
}

// lookupCanonical returns the value at an RFC 6901 JSON Pointer ("" is the
// whole value, "/a/0/b~1c" the member "b/c" of the first item of member
// "a") in the canonical JSON c, itself canonical.
func lookupCanonical(c []byte, pointer string) ([]byte, bool) {
	if pointer == "" {
		return c, true
	}
	for _, tok := range strings.Split(pointer[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c[0] {
		case '{':
			i, found := 1, false
			for c[i] != '}' {
				nameEnd := skipCanonical(c, i)
				valueEnd := skipCanonical(c, nameEnd+1)
				if nameIs(c[i:nameEnd], tok) {
					c, found = c[nameEnd+1:valueEnd], true
					break
				}
				i = valueEnd
				if c[i] == ',' {
					i++
				}
			}
			if !found {
				return nil, false
			}
		case '[':
			if tok == "" || (len(tok) > 1 && tok[0] == '0') {
				return nil, false
			}
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 {
				return nil, false
			}
			i := 1
			for ; n > 0 && c[i] != ']'; n-- {
				i = skipCanonical(c, i)
				if c[i] == ',' {
					i++
				}
			}
			if c[i] == ']' {
				return nil, false
			}
			c = c[i:skipCanonical(c, i)]
		default:
			return nil, false
		}
	}
	return c, true
}

// nameIs reports whether the canonical string s decodes to name.
func nameIs(s []byte, name string) bool {
	i := 1
	for k := 0; ; k++ {
		var c byte
		c, i = nameByte(s, i)
		if i < 0 {
			return k == len(name)
		}
		if k >= len(name) || name[k] != c {
			return false
		}
	}
}

// skipCanonical returns the index just past the canonical JSON value that
// starts at c[i].
func skipCanonical(c []byte, i int) int {
	switch c[i] {
	case '"':
		for i++; c[i] != '"'; i++ {
			if c[i] == '\\' {
				i++
			}
		}
		return i + 1
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch c[i] {
			case '"':
				i = skipCanonical(c, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(c) && c[i] != ',' && c[i] != '}' && c[i] != ']' && c[i] != ':' {
		i++
	}
	return i
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
