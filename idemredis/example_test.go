package idemredis_test

import (
	"crypto/rand"
	"log"
	"net/http"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemredis"
)

// A payment endpoint whose Idempotency-Key records live in Redis: a retry
// with the same key gets the stored answer, a concurrent one 409, a reused
// key with another body 422. The handler runs without a transaction, so its
// effects need an idempotency key of their own at the provider.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := idemredis.New(client, &idemredis.Config{Prefix: "payments:"})
	if err != nil {
		log.Fatal(err)
	}
	// 32 random bytes or more, from your secret store and the same on every
	// process; crypto/rand makes one for this example.
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	mw, err := idemhttp.NewWithBackend(store, &idemhttp.Config{
		FingerprintKeys: [][]byte{secret},
		// Your authentication decides the principal; keys are scoped by it.
		Account: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Charge the card with the Idempotency-Key as the provider's key, then
		// answer: the answer is stored and replayed to retries.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"status":"charged"}`))
	})))
	log.Fatal(http.ListenAndServe(os.Getenv("ADDR"), mux))
}
