package consumer

import (
	"errors"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestMessageAllocs: wrapping a fetched record costs the Message and its ID
// string, nothing more; with an IDFunc too (the record handed to it is the
// Message's own, not a heap copy of the argument).
func TestMessageAllocs(t *testing.T) {
	rec := kafka.Message{Topic: "t", Partition: 1, Offset: 7, Key: []byte("k"), Value: []byte("v"),
		Headers: []kafka.Header{{Key: IDHeaderDefault, Value: []byte("id-1")}}}
	idFunc := func(m *kafka.Message) (string, error) {
		for _, h := range m.Headers {
			if h.Key == IDHeaderDefault {
				return string(h.Value), nil
			}
		}
		return "", errors.New("no id")
	}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"header", Config{IDHeader: IDHeaderDefault}},
		{"IDFunc", Config{IDFunc: idFunc}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &worker{r: &Runner{cfg: tc.cfg}}
			var msg *Message
			allocs := testing.AllocsPerRun(200, func() { msg = w.message(rec) })
			if msg.ID != "id-1" || msg.idErr != nil || msg.Offset != 7 {
				t.Fatalf("message: ID %q, err %v, offset %d", msg.ID, msg.idErr, msg.Offset)
			}
			if allocs > 2 {
				t.Errorf("w.message allocates %.0f times per record, want at most 2 (the Message, its ID)", allocs)
			}
		})
	}
}

// TestTxFailed: a handler error gives the failing message's index and the
// handler's own error; any other error -1 and the error, wrapped.
func TestTxFailed(t *testing.T) {
	w := &worker{r: &Runner{}}
	msgs := []*Message{{}, {}}
	herr := &handlerError{index: 1, err: errors.New("boom")}
	i, err := w.txFailed(msgs, 0, herr)
	if i != 1 || err != herr.err {
		t.Fatalf("txFailed(handler error) = %d, %v; want 1, %v", i, err, herr.err)
	}
	netErr := errors.New("network")
	if i, err := w.txFailed(msgs, 0, netErr); i != -1 || !errors.Is(err, netErr) {
		t.Fatalf("txFailed(other error) = %d, %v; want -1 and the error", i, err)
	}
}
