// Command service is the smallest complete idemkit service: it marks
// orders paid once per PaymentSettled event (key: the order ID; value: a
// JSON object with an event_id), announces each with an OrderPaid event
// through the outbox, dead-letters what fails for good (an unknown order),
// serves /metrics with the Monitor's gauges, and stops cleanly on SIGINT or
// SIGTERM.
//
//	DATABASE_URL=postgres://… KAFKA_BROKERS=127.0.0.1:9092 go run ./service
//
// SCHEMA (default public) holds idemkit's tables and the orders table;
// METRICS_ADDR (default 127.0.0.1:9464) serves /metrics.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/monitor"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	pcfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	// The pool's sessions are bounded (docs/network-faults.md): a dial gives up after 10s, and the
	// server ends a transaction whose client went away.
	pcfg.ConnConfig.ConnectTimeout = 10 * time.Second
	for k, v := range map[string]string{"idle_in_transaction_session_timeout": "60s",
		"tcp_keepalives_idle": "15", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"} {
		pcfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables := migrate.Tables{Schema: cmp.Or(os.Getenv("SCHEMA"), "public")} // where idemkit's tables live: one value, passed everywhere
	m, err := migrate.New(pool, &migrate.Config{Tables: tables})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	kc := kafkaconn.Config{Brokers: strings.Split(os.Getenv("KAFKA_BROKERS"), ",")}
	for _, topic := range []string{"payments", "payments.dlq", "orders"} {
		if err := kafkaconn.CreateTopic(ctx, kc, topic, 6, -1); err != nil {
			return err
		}
	}

	tel, metrics, err := idemotel.NewPrometheus(nil)
	if err != nil {
		return err
	}
	store, err := dedup.New(&dedup.Config{Tables: tables})
	if err != nil {
		return err
	}
	events, err := outbox.New(&outbox.Config{Tables: tables})
	if err != nil {
		return err
	}
	wcfg := &dlq.WriterConfig{Kafka: kc, Group: "order-service", Pool: pool, Tables: tables}
	cfg := &consumer.Config{
		Kafka: kc, Topic: "payments", GroupID: "order-service", Store: store, IDFunc: consumer.IDFromJSON("event_id"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			orders := pgx.Identifier{tables.Schema, "orders"}.Sanitize() // the message key is the order ID
			tag, err := tx.Exec(ctx, `UPDATE `+orders+` SET status = 'paid' WHERE id = $1`, string(msg.Key))
			if err != nil {
				return err // rolls back the effect and the claim: the message is tried again
			}
			if tag.RowsAffected() == 0 {
				return retry.Permanent(fmt.Errorf("no order %q", msg.Key)) // to payments.dlq, not retried
			}
			paid, _ := json.Marshal(map[string]string{"order_id": string(msg.Key), "status": "paid"})
			_, err = events.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Key: msg.Key, Value: paid})
			return err
		}),
	}
	c, err := tel.Consumer(cfg)
	if err != nil {
		return err
	}
	if err := c.DeadLetterWriter(wcfg); err != nil {
		return err
	}
	dead, err := dlq.NewWriter(wcfg)
	if err != nil {
		return err
	}
	defer dead.Close()
	cfg.OnFailure = c.DeadLetters(dead) // what fails for good goes to payments.dlq
	payments, err := consumer.New(pool, cfg)
	if err != nil {
		return err
	}
	if err := c.Observe(payments); err != nil {
		return err
	}
	rcfg := &outbox.RelayConfig{Kafka: kc}
	if err := tel.Relay(events, rcfg); err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, events, rcfg)
	if err != nil {
		return err
	}
	mon, err := tel.Monitor(pool, &idemotel.MonitorConfig{Config: monitor.Config{Kafka: kc, Tables: tables},
		DeadLetterTopics: []string{"payments.dlq"}})
	if err != nil {
		return err
	}
	defer mon.Close()

	ln, err := net.Listen("tcp", cmp.Or(os.Getenv("METRICS_ADDR"), "127.0.0.1:9464"))
	if err != nil {
		return err // the port is taken: say so rather than serve nothing
	}
	srv := &http.Server{Handler: metrics, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	log.Printf("order-service: consuming payments (schema %s), metrics on http://%s/metrics; Ctrl-C or SIGTERM stops it",
		tables.Schema, ln.Addr())
	// Every runner until SIGTERM, or until one fails: then all stop.
	return idemkit.RunAll(ctx, payments, relay, mon)
}
