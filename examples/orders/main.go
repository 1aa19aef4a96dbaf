// Command orders is idemkit's demo: an order service that marks an order paid
// once per OrderPaid event, however often Kafka delivers the event.
//
// scripts/demo starts the development servers and runs it. It works in its own
// PostgreSQL schema, orders_demo, which it drops and recreates first (and
// leaves behind for you to look at), and in a new topic, which it deletes at
// the end:
//
//  1. setup: idemkit's migrations, the service's tables (schema.sql) and ten
//     pending orders;
//  2. produce: one OrderPaid event per order, and one of them twice (a
//     producer retry);
//  3. consumer 1 handles events, one transaction each, and stops right after
//     a database commit, before the Kafka offset commit: where a crash hurts;
//  4. consumer 2, in a new consumer group (Kafka has no offsets for it) with
//     the same Name, resumes from the positions PostgreSQL recorded; an old
//     event is replayed meanwhile;
//  5. the final state: every order paid, every balance the sum of its orders.
//     It exits with status 1 if any payment was not applied exactly once.
//
// Usage:
//
//	cd examples && go run ./orders [-database-url URL] [-brokers host:port,...] [-metrics ADDR] [-linger D]
//
// It serves its metrics on http://127.0.0.1:9464/metrics (OpenTelemetry's
// Prometheus exporter, via the module github.com/idemkit/idemkit/idemotel) while
// it runs, -linger longer, and prints the trace of one event at the end.
//
// The flags default to IDEMKIT_DATABASE_URL and IDEMKIT_KAFKA_BROKERS (as
// scripts/demo sets them), else IDEMKIT_TEST_DATABASE_URL and
// IDEMKIT_TEST_KAFKA_BROKERS, else the servers of scripts/dev.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// schema is the demo's own schema: dropped and recreated on every run.
const schema = "orders_demo"

func main() { os.Exit(run()) }

func run() int {
	dbURL := flag.String("database-url", cmp.Or(os.Getenv("IDEMKIT_DATABASE_URL"),
		os.Getenv("IDEMKIT_TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:54329/idemkit?sslmode=disable&connect_timeout=10"),
		"PostgreSQL URL of a user that may create schemas")
	brokers := flag.String("brokers", cmp.Or(os.Getenv("IDEMKIT_KAFKA_BROKERS"),
		os.Getenv("IDEMKIT_TEST_KAFKA_BROKERS"), "127.0.0.1:19092"),
		"comma-separated Kafka bootstrap addresses")
	metrics := flag.String("metrics", "127.0.0.1:9464", "serve /metrics (OpenTelemetry's Prometheus exporter) here; empty: no telemetry")
	linger := flag.Duration("linger", 0, "keep serving /metrics this long after the demo (for a scrape or a curl)")
	flag.Parse()

	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sigCtx, 2*time.Minute)
	defer cancel()

	fmt.Printf("idemkit demo: an order service marks orders paid, once per OrderPaid event\n")
	fmt.Printf("PostgreSQL %s, Kafka %s\n", *dbURL, *brokers)
	var obs *telemetry
	if *metrics != "" {
		var err error
		if obs, err = startTelemetry(*metrics); err != nil {
			fmt.Fprintln(os.Stderr, "orders:", err, "(pass -metrics '' to run without telemetry)")
			return 1
		}
		defer func() { _ = obs.shutdown(context.Background()) }()
		fmt.Printf("metrics: curl -s http://%s/metrics | grep ^idemkit_\n", obs.addr)
	}
	fmt.Println()
	res, err := scenario(ctx, *dbURL, strings.Split(*brokers, ","), schema, os.Stdout, obs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		return 1
	}
	if obs != nil {
		fmt.Printf("\n6. the trace of %s (sent twice): its producer span, and the consumer's spans that continued it\n", res.Retried)
		obs.printTrace(os.Stdout, res.Retried)
		if *linger > 0 {
			fmt.Printf("\nserving http://%s/metrics for %s (Ctrl-C to stop)\n", obs.addr, *linger)
			select {
			case <-time.After(*linger):
			case <-sigCtx.Done():
			}
		}
	}
	fmt.Printf("\nlook around: psql %q -c 'TABLE %s.orders' -c 'TABLE %s.processed_messages'\n",
		*dbURL, schema, schema)
	return 0
}
