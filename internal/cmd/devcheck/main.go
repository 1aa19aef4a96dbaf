// Command devcheck tells whether the development servers really answer: it runs
// a query on PostgreSQL and a metadata request on Kafka. scripts/dev uses it to
// wait for the servers it starts; it exits 0 once every named server answered,
// and 1 with a one-line reason when the time is up. With -kafka-ca and
// -kafka-sasl it checks a SASL_SSL listener: the TLS handshake against that CA
// and the SASL exchange with -kafka-user and $IDEMKIT_KAFKA_PASSWORD. With
// -kafka-brokers N it waits until the metadata lists N brokers (a cluster
// whose nodes all registered).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/kafkaconn"
)

func main() {
	pgURL := flag.String("postgres", "", "PostgreSQL URL to query (skipped when empty)")
	brokers := flag.String("kafka", "", "Kafka broker address to ask for metadata (skipped when empty)")
	ca := flag.String("kafka-ca", "", "PEM CA file: speak TLS to -kafka, trusting it")
	mech := flag.String("kafka-sasl", "", "SASL mechanism for -kafka (password from $IDEMKIT_KAFKA_PASSWORD)")
	user := flag.String("kafka-user", "", "SASL user for -kafka")
	want := flag.Int("kafka-brokers", 1, "how many brokers -kafka's metadata must list (a cluster: every node registered)")
	wait := flag.Duration("wait", 60*time.Second, "how long to keep trying")
	flag.Parse()
	if *pgURL == "" && *brokers == "" {
		fmt.Fprintln(os.Stderr, "devcheck: name -postgres URL and/or -kafka host:port")
		os.Exit(2)
	}
	kc := kafkaconn.Config{Brokers: []string{*brokers}}
	if *ca != "" {
		t, err := kafkaconn.LoadTLS(kafkaconn.TLSFiles{CA: *ca})
		if err != nil {
			fmt.Fprintf(os.Stderr, "devcheck: %v\n", err)
			os.Exit(2)
		}
		kc.TLS = t
	}
	if *mech != "" {
		kc.SASL = &kafkaconn.SASL{Mechanism: kafkaconn.Mechanism(*mech), Username: *user, Password: os.Getenv("IDEMKIT_KAFKA_PASSWORD")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()

	var last error
	for {
		last = check(ctx, *pgURL, *brokers, *want, &kc)
		if last == nil {
			return
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "devcheck: no answer after %s: %v\n", *wait, last)
			os.Exit(1)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func check(ctx context.Context, pgURL, broker string, want int, kc *kafkaconn.Config) error {
	attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if pgURL != "" {
		conn, err := pgx.Connect(attempt, pgURL)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		var version string
		err = conn.QueryRow(attempt, "SELECT current_setting('server_version')").Scan(&version)
		_ = conn.Close(context.WithoutCancel(attempt))
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		fmt.Printf("postgres answers: server_version %s\n", version)
	}
	if broker != "" {
		tr, err := kc.Transport()
		if err != nil {
			fmt.Fprintf(os.Stderr, "devcheck: %v\n", err)
			os.Exit(2)
		}
		defer tr.CloseIdleConnections()
		client := &kafka.Client{Addr: kc.Addr(), Timeout: 5 * time.Second, Transport: tr}
		md, err := client.Metadata(attempt, &kafka.MetadataRequest{})
		if err != nil {
			return fmt.Errorf("kafka: %w", kc.Wrap(err))
		}
		if len(md.Brokers) == 0 {
			return errors.New("kafka: metadata lists no broker yet")
		}
		if len(md.Brokers) < want {
			return fmt.Errorf("kafka: metadata lists %d of %d brokers", len(md.Brokers), want)
		}
		fmt.Printf("kafka (%s) answers: %d broker(s), controller %d, cluster %s\n", kc, len(md.Brokers), md.Controller.ID, md.ClusterID)
	}
	return nil
}
