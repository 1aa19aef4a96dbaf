// Package containers starts PostgreSQL and Kafka in Docker through
// testcontainers-go, for a machine where no server is named by the
// environment but a Docker engine is reachable. It lives in the test module so
// that users of the library never inherit Docker client dependencies.
package containers

import (
	"context"
	"errors"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/idemkit/idemkit/internal/testenv"
)

// Images used when Docker starts the servers. The testcontainers Kafka module
// (v0.40, the newest served with a Kafka module) runs only confluent-local
// images; 7.9 carries Apache Kafka 3.9 in KRaft mode. scripts/dev, which
// needs no Docker, runs Apache Kafka 4.x.
const (
	PostgresImage = "postgres:15"
	KafkaImage    = "confluentinc/confluent-local:7.9.0"
)

// ErrNoDocker means no Docker engine answered.
var ErrNoDocker = errors.New("no Docker engine is reachable")

// Start is a testenv.Starter: it starts both servers in containers.
func Start(ctx context.Context) (testenv.Servers, func(), error) {
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return testenv.Servers{}, nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	if err := provider.Health(ctx); err != nil {
		_ = provider.Close()
		return testenv.Servers{}, nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	_ = provider.Close()

	pg, err := tcpostgres.Run(ctx, PostgresImage,
		tcpostgres.WithDatabase("idemkit"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return testenv.Servers{}, nil, fmt.Errorf("start postgres container: %w", err)
	}
	stopPG := func() { _ = testcontainers.TerminateContainer(pg) }
	url, err := pg.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		stopPG()
		return testenv.Servers{}, nil, fmt.Errorf("postgres container address: %w", err)
	}
	kc, err := tckafka.Run(ctx, KafkaImage, tckafka.WithClusterID("idemkit-test"))
	if err != nil {
		stopPG()
		return testenv.Servers{}, nil, fmt.Errorf("start kafka container: %w", err)
	}
	brokers, err := kc.Brokers(ctx)
	stop := func() { _ = testcontainers.TerminateContainer(kc); stopPG() }
	if err != nil {
		stop()
		return testenv.Servers{}, nil, fmt.Errorf("kafka container address: %w", err)
	}
	return testenv.Servers{DatabaseURL: url, Brokers: brokers}, stop, nil
}
