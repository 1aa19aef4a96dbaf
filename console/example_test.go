package console_test

import (
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/console"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

// The console mounted under /console in a service's own mux, behind the
// service's authentication.
func Example() {
	var pool *pgxpool.Pool // the service's pool
	kc := kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}
	c, err := console.New(pool, &console.Config{
		Kafka:  kc,
		Tables: migrate.Tables{Schema: "orders"},
		Authorize: func(r *http.Request) (console.Principal, error) {
			user, _, ok := r.BasicAuth() // the service's own check goes here
			if !ok {
				return console.Principal{}, console.ErrUnauthorized
			}
			return console.Principal{Name: user}, nil
		},
		BasePath: "/console",
	})
	if err != nil {
		log.Fatal(err) // a nil pool here: console: invalid configuration
	}
	defer c.Close()
	mux := http.NewServeMux()
	mux.Handle("/console/", c)
}
