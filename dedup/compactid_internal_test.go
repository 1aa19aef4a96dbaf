package dedup

import (
	"fmt"
	"testing"
)

func format(b [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// compactID accepts exactly the strings a uuid prints as, and gives back
// the bytes that print as the same string.
func FuzzCompactID(f *testing.F) {
	for _, s := range []string{"0b7e2f4c-3a51-4d2e-9f60-1c2d3e4f5a6b", "0B7E2F4C-3A51-4D2E-9F60-1C2D3E4F5A6B",
		"0b7e2f4c3a514d2e9f601c2d3e4f5a6b", "{0b7e2f4c-3a51-4d2e-9f60-1c2d3e4f5a6b}", "", "order-1",
		"0b7e2f4c-3a51-4d2e-9f60-1c2d3e4f5a6", "0b7e2f4c_3a51-4d2e-9f60-1c2d3e4f5a6b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u := compactID(s)
		if u.Valid && format(u.Bytes) != s {
			t.Fatalf("compactID(%q) = %s", s, format(u.Bytes))
		}
		if !u.Valid && len(s) == 36 {
			// A string that is not canonical never prints as itself.
			var b [16]byte
			for i := range 16 {
				if _, err := fmt.Sscanf(s[2*i+dashes(2*i):2*i+dashes(2*i)+2], "%02x", &b[i]); err != nil {
					return
				}
			}
			if format(b) == s {
				t.Fatalf("compactID(%q) refused a canonical UUID", s)
			}
		}
	})
}

// dashes is how many hyphens precede hex digit i of a canonical UUID.
func dashes(i int) int {
	n := 0
	for _, d := range []int{8, 12, 16, 20} {
		if i >= d {
			n++
		}
	}
	return n
}

func TestCompactIDRoundTrip(t *testing.T) {
	for i := range 1000 {
		var b [16]byte
		for j := range b {
			b[j] = byte(i*31 + j*17 + i*j)
		}
		u := compactID(format(b))
		if !u.Valid || u.Bytes != b {
			t.Fatalf("compactID(%s) = %v", format(b), u)
		}
	}
}
