// Command idemkit-containers starts PostgreSQL and Kafka in Docker through
// testcontainers-go, writes the environment the tests read to a file, and
// keeps the containers until it is interrupted. scripts/test runs it when no
// server is named and a Docker engine is reachable.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func main() {
	envFile := flag.String("env-file", "", "where to write the export lines (required)")
	flag.Parse()
	if *envFile == "" {
		fmt.Fprintln(os.Stderr, "idemkit-containers: -env-file is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := containers.ConfigFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "idemkit-containers: %v\n", err)
		os.Exit(2)
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	s, sasl, release, err := containers.StartWith(startCtx, c)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "idemkit-containers: %v\n", err)
		os.Exit(1)
	}
	defer release()
	env := fmt.Sprintf("export %s='%s'\nexport %s='%s'\n",
		testenv.EnvDatabaseURL, s.DatabaseURL, testenv.EnvKafkaBrokers, strings.Join(s.Brokers, ","))
	if sasl != nil { // host mode: the broker's SASL_SSL listener, for the SASL tests
		env += fmt.Sprintf("export IDEMKIT_TEST_KAFKA_SASL_BROKERS='%s'\nexport IDEMKIT_TEST_KAFKA_CA='%s'\n"+
			"export IDEMKIT_TEST_KAFKA_USER='%s'\nexport IDEMKIT_TEST_KAFKA_PASSWORD='%s'\n",
			sasl.Brokers, sasl.CAFile, sasl.User, sasl.Password)
	}
	if err := os.WriteFile(*envFile, []byte(env), 0o600); err != nil {
		fmt.Fprintf(os.Stderr, "idemkit-containers: %v\n", err)
		return
	}
	fmt.Println("idemkit-containers: servers ready; environment in", *envFile)
	<-ctx.Done()
}
