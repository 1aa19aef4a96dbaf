package idemhttp_test

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

// jsonBodies1MiB are request bodies of about 1 MiB (MaxRequestBytesDefault)
// in the shapes that cost a canonicaliser most per byte.
func jsonBodies1MiB() map[string][]byte {
	const size = 1 << 20
	fill := func(open, item, sep, end string) []byte {
		var b bytes.Buffer
		b.WriteString(open)
		for i := 0; b.Len()+len(item)+len(sep)+len(end) < size; i++ {
			if i > 0 {
				b.WriteString(sep)
			}
			if strings.Contains(item, "%d") {
				fmt.Fprintf(&b, item, i)
			} else {
				b.WriteString(item)
			}
		}
		b.WriteString(end)
		return b.Bytes()
	}
	return map[string][]byte{
		"zeros":   fill("[", "0", ",", "]"),
		"members": fill("{", `"%d":0`, ",", "}"),
		"objects": fill("[", "{}", ",", "]"),
		"nested":  fill("[", `{"a":[{"b":1}]}`, ",", "]"),
		"strings": fill("[", `"ab\u00e9"`, ",", "]"),
	}
}

// BenchmarkIntent1MiB measures the memory the default intent (the
// canonical JSON of the body) allocates per request for 1 MiB JSON bodies:
// MiB/req is the heap allocated per request, in MiB.
func BenchmarkIntent1MiB(b *testing.B) {
	for name, body := range jsonBodies1MiB() {
		b.Run(name, func(b *testing.B) {
			r, err := http.NewRequest(http.MethodPost, "http://example.com/payments", nil)
			if err != nil {
				b.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				if _, err := idemhttp.IntentDefault(r, body); err != nil {
					b.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/(1<<20), "MiB/req")
		})
	}
}
