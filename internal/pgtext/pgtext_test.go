package pgtext

import (
	"go.uber.org/goleak"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		max  int
		want string
	}{
		{"plain", "boom", 10, "boom"},
		{"no limit", strings.Repeat("a", 5000), 0, strings.Repeat("a", 5000)},
		{"exact", "abcde", 5, "abcde"},
		{"cut", "abcdefgh", 6, "abc…"},
		{"NUL", "a\x00b", 0, "a\uFFFDb"},
		{"invalid UTF-8", "a\xffb\xfe\xfdc", 0, "a\uFFFDb\uFFFDc"},
		{"rune boundary", "ab€€", 7, "ab…"}, // "€" is 3 bytes: "ab€" + "…" would be 8
		{"rune boundary fits", "ab€€€", 8, "ab€…"},
		{"tiny max", "ab€€", 2, "ab"},
		{"tiny max in rune", "€€", 2, ""},
		{"NUL counted after replacement", "\x00\x00\x00", 6, "\uFFFD…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Text(tc.in, tc.max)
			if got != tc.want {
				t.Fatalf("Text(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
			}
		})
	}
}

func FuzzText(f *testing.F) {
	for _, s := range []string{"", "boom", "a\x00b", "\xff\xfe", "ab€€", strings.Repeat("é", 1500)} {
		f.Add(s, 2000)
		f.Add(s, 5)
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		max %= 5000
		got := Text(s, max)
		if !utf8.ValidString(got) {
			t.Fatalf("Text(%q, %d) = %q: not valid UTF-8", s, max, got)
		}
		if strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("Text(%q, %d) = %q: holds NUL", s, max, got)
		}
		if max > 0 && len(got) > max {
			t.Fatalf("Text(%q, %d) = %q: %d bytes", s, max, got, len(got))
		}
		if again := Text(got, max); again != got {
			t.Fatalf("Text not idempotent: %q then %q", got, again)
		}
		if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && (max <= 0 || len(s) <= max) && got != s {
			t.Fatalf("Text(%q, %d) = %q: changed a storable text", s, max, got)
		}
	})
}
