package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idemkit/idemhttp"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`{"b":1,"a":[true,false,null]}`, `{"a":[true,false,null],"b":1}`},
		{" { \"a\" :\n\t{ \"d\":1, \"c\":2 } } ", `{"a":{"c":2,"d":1}}`},
		{`10000`, `10000`},
		{`1e4`, `10000`},
		{`1E+4`, `10000`},
		{`10000.000`, `10000`},
		{`0.1e5`, `10000`},
		{`100000e-1`, `10000`},
		{`-0`, `0`},
		{`-0.0e-7`, `0`},
		{`0.5`, `0.5`},
		{`5e-1`, `0.5`},
		{`-12.50`, `-12.5`},
		{`0.000001`, `0.000001`},
		{`0.0000001`, `1e-7`},
		{`123456789012345678901`, `123456789012345678901`},
		{`1234567890123456789012`, `1.234567890123456789012e+21`},
		{`1e30`, `1e+30`},
		{`0.10000000000000001`, `0.10000000000000001`},
		{`1e999999999999999`, `1e+999999999999999`},
		{`"a\u0041\n\/\"\\\u00e9\ud83d\ude00\u0001"`, "\"aA\\n/\\\"\\\\\u00e9\U0001F600\\u0001\""},
		{`{"é":1,"e":2,"z":3}`, `{"e":2,"z":3,"é":1}`},
		{`[]`, `[]`},
		{`{}`, `{}`},
	} {
		got, err := idemhttp.CanonicalJSON([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{
		``, ` `, `{`, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `+1`, `1e`, `--1`, `NaN`, `tru`, `"a`, `"\x"`,
		"\"\x01\"", `{"a":1,"a":2}`, `{"a":1,"A":2}`, `{"ſ":1,"s":2}`, `{"a":1}{}`, `"\ud800"`, `"\udc00x"`, `"\ud800\u0041"`, "\"\xff\"",
		`1e1234567890123456`, strings.Repeat("[", 513) + strings.Repeat("]", 513),
	} {
		if got, err := idemhttp.CanonicalJSON([]byte(in)); !errors.Is(err, idemhttp.ErrInvalidJSON) {
			t.Errorf("CanonicalJSON(%q) = %s, %v; want ErrInvalidJSON", in, got, err)
		}
	}
	deep := strings.Repeat("[", 512) + strings.Repeat("]", 512)
	if _, err := idemhttp.CanonicalJSON([]byte(deep)); err != nil {
		t.Errorf("512 levels: %v", err)
	}
}

// Equal JSON values have equal canonical forms (so equal
// fingerprints) and different values different ones. The reference is
// encoding/json with numbers compared as exact rationals.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"orderId":"order-842","amount":10000,"currency":"BRL"}`,
		`{"currency":"BRL","amount":1e4,"orderId":"order-842"}`,
		`{"amount":10000.5}`, `[1,2,3]`, `[3,2,1]`, `"x"`, `"\u0078"`, `null`, `0`, `-0.0`, `1E-7`,
		`{"a":{"b":[{"c":null}]}}`, `{"a":1,"b":2}`, `{"a":2,"b":1}`, `0.1`, `0.10000000000000001`,
	} {
		f.Add([]byte(s), []byte(`{"amount":10000,"orderId":"order-842","currency":"BRL"}`))
	}
	f.Add([]byte(`[1e20,1e20,1e20,1e-6]`), []byte(`{"b":{},"a":[{"d":0,"c":0}],"":0}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		checkAllocs(t, a)
		ca, errA := idemhttp.CanonicalJSON(a)
		cb, errB := idemhttp.CanonicalJSON(b)
		checkOne(t, a, ca, errA)
		checkOne(t, b, cb, errB)
		if errA != nil || errB != nil {
			return
		}
		ra, okA := reference(a)
		rb, okB := reference(b)
		if !okA || !okB {
			return
		}
		if eq := refEqual(ra, rb); eq != bytes.Equal(ca, cb) {
			t.Fatalf("values equal=%v but canonical forms equal=%v:\n%s -> %s\n%s -> %s", eq, !eq, a, ca, b, cb)
		}
	})
}

// maxAllocPerByte bounds the heap CanonicalJSON allocates per input byte
// (plus allocBase per call), whatever the shape of the input: its canonical
// form (up to about 5 times the input, for numbers such as 1e20 written
// out, grown by appending) and a few words per member of the objects open.
const (
	maxAllocPerByte = 32
	allocBase       = 4096
)

// checkAllocs checks the heap CanonicalJSON allocates for in against
// maxAllocPerByte (the least of three runs, so that an allocation of
// another goroutine does not count).
func checkAllocs(t *testing.T, in []byte) {
	t.Helper()
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _ = idemhttp.CanonicalJSON(in)
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	if limit := uint64(maxAllocPerByte*len(in) + allocBase); least > limit {
		t.Fatalf("CanonicalJSON of %d bytes allocated %d bytes, more than %d (%d per byte + %d): %.100q",
			len(in), least, limit, maxAllocPerByte, allocBase, in)
	}
}

// TestCanonicalJSONAllocs: the allocation bound of the fuzz target holds
// for the 1 MiB bodies of the benchmark, the shapes that cost most per byte.
func TestCanonicalJSONAllocs(t *testing.T) {
	for name, body := range jsonBodies1MiB() {
		t.Run(name, func(t *testing.T) { checkAllocs(t, body) })
	}
}

// checkOne checks CanonicalJSON on one input against encoding/json.
func checkOne(t *testing.T, in, out []byte, err error) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, idemhttp.ErrInvalidJSON) {
			t.Fatalf("error %v does not match ErrInvalidJSON", err)
		}
		// Valid JSON is rejected only for the documented reasons.
		if json.Valid(in) && utf8.Valid(in) && !strings.Contains(err.Error(), "duplicate member") &&
			!strings.Contains(err.Error(), "surrogate") && !strings.Contains(err.Error(), "exponent") &&
			!strings.Contains(err.Error(), "nested deeper") && !strings.Contains(err.Error(), "but for case") {
			t.Fatalf("rejected valid JSON %q: %v", in, err)
		}
		return
	}
	if !json.Valid(in) {
		t.Fatalf("accepted invalid JSON %q", in)
	}
	if !json.Valid(out) {
		t.Fatalf("canonical form %q of %q is not JSON", out, in)
	}
	again, err := idemhttp.CanonicalJSON(out)
	if err != nil || !bytes.Equal(again, out) {
		t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, out, again, err)
	}
	// Same value re-encoded by encoding/json (other whitespace, escapes and
	// member order) has the same canonical form.
	var v any
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatalf("encoding/json rejects %q: %v", in, err)
	}
	re, err := json.MarshalIndent(v, " ", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := idemhttp.CanonicalJSON(re); err != nil || !bytes.Equal(c, out) {
		t.Fatalf("re-encoded %q -> %q, %v; want %q", re, c, err, out)
	}
}

// reference decodes with encoding/json; ok is false for values whose
// numbers are too large to compare exactly at a reasonable cost.
func reference(in []byte) (any, bool) {
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, false
	}
	return v, small(v)
}

func small(v any) bool {
	switch v := v.(type) {
	case json.Number:
		s := strings.ToLower(string(v))
		if i := strings.IndexByte(s, 'e'); i >= 0 {
			return len(strings.TrimLeft(strings.TrimLeft(s[i+1:], "+-"), "0")) <= 4
		}
		return true
	case []any:
		for _, x := range v {
			if !small(x) {
				return false
			}
		}
	case map[string]any:
		for _, x := range v {
			if !small(x) {
				return false
			}
		}
	}
	return true
}

func refEqual(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		ra, okA := new(big.Rat).SetString(string(a))
		rb, okB := new(big.Rat).SetString(string(b))
		return okA && okB && ra.Cmp(rb) == 0
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !refEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, x := range a {
			y, ok := b[k]
			if !ok || !refEqual(x, y) {
				return false
			}
		}
		return true
	default: // string, bool, nil
		return a == b
	}
}
