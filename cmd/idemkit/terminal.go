package main

import (
	"io"
	"unicode/utf8"
)

// termWriter escapes, in everything written through it, the control
// characters a terminal acts on: C0 but tab and newline, DEL, and C1
// (U+0080 to U+009F, and the raw bytes 0x80 to 0x9F outside UTF-8
// sequences), each as \u00XX. So a message ID, key, value, header name or
// error text cannot hide text (ESC[8m), set the window title (OSC 0) or
// write the clipboard (OSC 52); in JSON output \u00XX is the same
// character, escaped. Every output of the CLI goes through one.
type termWriter struct {
	w       io.Writer
	pending []byte // the start of a UTF-8 sequence split across writes
	buf     []byte
}

func newTermWriter(w io.Writer) *termWriter { return &termWriter{w: w} }

func (t *termWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(t.pending) > 0 {
		p = append(t.pending, p...)
		t.pending = nil
	}
	t.buf = t.buf[:0]
	for i := 0; i < len(p); {
		c := p[i]
		switch {
		case c == '\t' || c == '\n':
			t.buf = append(t.buf, c)
			i++
			continue
		case c < 0x20 || c == 0x7f:
			t.buf = appendEscape(t.buf, rune(c))
			i++
			continue
		case c < utf8.RuneSelf:
			t.buf = append(t.buf, c)
			i++
			continue
		}
		if !utf8.FullRune(p[i:]) && len(p)-i < utf8.UTFMax {
			t.pending = append([]byte(nil), p[i:]...)
			break
		}
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			if c <= 0x9f {
				t.buf = appendEscape(t.buf, rune(c)) // a raw 8-bit C1 byte
			} else {
				t.buf = append(t.buf, c)
			}
		case r >= 0x80 && r <= 0x9f:
			t.buf = appendEscape(t.buf, r)
		default:
			t.buf = append(t.buf, p[i:i+size]...)
		}
		i += size
	}
	if _, err := t.w.Write(t.buf); err != nil {
		return 0, err
	}
	return n, nil
}

// Flush writes what is pending (an incomplete UTF-8 sequence), escaped.
func (t *termWriter) Flush() error {
	if len(t.pending) == 0 {
		return nil
	}
	var b []byte
	for _, c := range t.pending {
		b = appendEscape(b, rune(c))
	}
	t.pending = nil
	_, err := t.w.Write(b)
	return err
}

func appendEscape(b []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	return append(b, '\\', 'u', '0', '0', hex[r>>4&0xf], hex[r&0xf])
}
