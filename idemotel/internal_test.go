package idemotel

import (
	"testing"

	"github.com/segmentio/kafka-go"
)

func TestOpLabel(t *testing.T) {
	t.Parallel()
	c := &Consumer{opPrefix: "consumer g/orders: "}
	for op, want := range map[string]string{
		"consumer g/orders: postgres partition 3":     "postgres partition",
		"consumer g/orders: kafka fetch partition 12": "kafka fetch partition",
		"consumer g/orders: kafka consumer group":     "kafka consumer group",
		"consumer g/orders: postgres schema":          "postgres schema",
		"write to orders.dlq: kafka":                  "write to orders.dlq: kafka",
	} {
		if got := c.opLabel(op); got != want {
			t.Errorf("opLabel(%q) = %q, want %q", op, got, want)
		}
	}
}

func TestHeaderCarrier(t *testing.T) {
	t.Parallel()
	hs := HeaderCarrier{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}, {Key: "a", Value: []byte("3")}}
	if got := hs.Get("a"); got != "1" {
		t.Errorf("Get(a) = %q, want the first, 1", got)
	}
	if got := hs.Get("A"); got != "" {
		t.Errorf("Get(A) = %q: keys are case-sensitive", got)
	}
	hs.Set("a", "4")
	if got := []kafka.Header(hs); len(got) != 2 || got[0].Key != "b" || got[1].Key != "a" || string(got[1].Value) != "4" {
		t.Errorf("after Set(a, 4): %v, want b=2 a=4", got)
	}
	if keys := hs.Keys(); len(keys) != 2 || keys[0] != "b" || keys[1] != "a" {
		t.Errorf("Keys() = %v", keys)
	}
}
