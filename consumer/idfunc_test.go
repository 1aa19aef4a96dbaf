package consumer_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
)

// TestIDFuncPanic: an IDFunc that panics on a malformed message (here:
// it reads a fixed-width prefix of the value) is user code like a handler:
// its panic becomes the message's error (ErrMissingID, to OnFailure), as a
// handler's does. IDFunc runs in the prefetch goroutine, where an
// unrecovered panic would kill the process, so the runner runs in a child
// process where such a crash can be observed; IDEMKIT_TEST_IDFUNC_CHILD
// names its mode.
func TestIDFuncPanic(t *testing.T) {
	if name := os.Getenv("IDEMKIT_TEST_IDFUNC_CHILD"); name != "" {
		for _, md := range baseModes {
			if md.name == name {
				idFuncChild(t, md)
				return
			}
		}
		t.Fatalf("IDEMKIT_TEST_IDFUNC_CHILD=%q names no mode", name)
	}
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run", "^TestIDFuncPanic$", "-test.v")
			cmd.Env = append(os.Environ(), "IDEMKIT_TEST_IDFUNC_CHILD="+md.name)
			out, err := cmd.CombinedOutput()
			if err != nil {
				i := strings.Index(string(out), "panic:")
				if i < 0 {
					i = 0
				}
				t.Fatalf("the runner's process died: %v\n%.600s", err, out[i:])
			}
		})
	}
}

func idFuncChild(t *testing.T, md mode) {
	e := newEnv(t, 1)
	e.produce(kafka.Message{Key: []byte("k"), Value: []byte("x")}, kafka.Message{Key: []byte("k"), Value: []byte("order-000042")})
	cfg := e.config(md, nil)
	cfg.Handler = consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	cfg.IDFunc = func(m *kafka.Message) (string, error) { return string(m.Value[:12]), nil }
	failed := make(chan struct{}, 1)
	cfg.OnFailure = func(_ context.Context, m *consumer.Message, err error) error {
		if !errors.Is(err, consumer.ErrMissingID) {
			t.Errorf("OnFailure got %v, want ErrMissingID", err)
		}
		failed <- struct{}{}
		return nil
	}
	stop := run(t, e.db.Pool, cfg)
	select {
	case <-failed:
	case <-time.After(60 * time.Second):
		t.Fatal("the malformed message never reached OnFailure")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
