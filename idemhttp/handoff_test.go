package idemhttp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
)

// A request that finds a key free reads its record after it took the key's
// lock, so that it sees what the holder before it committed: a duplicate
// looking at the key while the holder commits gets the holder's record,
// never the key as if no one had run it. Each round a holder completes while
// a duplicate looks at the key without pause (hundreds of looks around the
// commit); a duplicate given the key is the fault.
func TestDuplicateAtTheHoldersCommitSeesItsRecord(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	b, err := e.store.Backend(e.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const rounds = 200
	looks := 0
	for round := range rounds {
		req := &idemhttp.Request{Account: "acct-1", Operation: "POST /payments", Key: newKey(),
			Fingerprint: []byte("fingerprint"), Lease: time.Minute, TTL: time.Hour}
		holder, err := b.Reserve(ctx, req)
		if err != nil || holder.Hold == nil {
			t.Fatalf("round %d: the first reservation: %+v, %v", round, holder, err)
		}
		looking := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			// The duplicate looks until it sees the holder's record.
			close(looking)
			for {
				res, err := b.Reserve(ctx, req)
				looks++
				switch {
				case err != nil:
					done <- err
					return
				case res.Hold != nil:
					_ = res.Hold.Release(ctx)
					done <- errGivenTheKey
					return
				case res.State == idemhttp.StateCompleted:
					done <- nil
					return
				}
			}
		}()
		<-looking
		if err := holder.Hold.Complete(ctx, idemhttp.Response{Status: http.StatusCreated, Body: []byte("ok")}); err != nil {
			t.Fatalf("round %d: complete: %v", round, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: the duplicate: %v", round, err)
		}
	}
	t.Logf("%d rounds, %d looks", rounds, looks)
}

var errGivenTheKey = &givenTheKey{}

type givenTheKey struct{}

func (*givenTheKey) Error() string {
	return "given the key while its holder's record was committed: it would run the handler again"
}
