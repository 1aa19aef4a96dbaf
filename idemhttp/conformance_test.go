package idemhttp_test

import (
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemhttp/idemhttptest"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// The PostgreSQL store passes the Backend conformance suite, in
// transaction mode.
func TestConformance(t *testing.T) {
	t.Parallel()
	idemhttptest.Run(t, func(t *testing.T) idemhttp.Backend {
		db := testenv.NewDB(t, migrated)
		store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := store.Backend(db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, idemhttptest.Options{Transactional: true})
}
