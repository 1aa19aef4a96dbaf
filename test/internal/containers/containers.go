// Package containers starts PostgreSQL and Kafka in Docker through
// testcontainers-go, for a machine where no server is named by the
// environment but a Docker engine is reachable. It lives in the test module so
// that users of the library never inherit Docker client dependencies.
//
// Two ways, chosen by IDEMKIT_CONTAINERS_NETWORK:
//
//   - unset (the default, for Docker users): the public images through the
//     testcontainers PostgreSQL and Kafka modules, on Docker's own network
//     with mapped ports;
//   - "host": images that follow the contract of scripts/containers (built
//     locally by scripts/containers-images: idemkit/postgres:15 and
//     idemkit/kafka:4.1.1) as generic containers on the host's network,
//     listening on 127.0.0.1 only, on IDEMKIT_CONTAINERS_PG_PORT (55432) and
//     IDEMKIT_CONTAINERS_KAFKA_PORT (29092; the KRaft controller takes the
//     next port). No bridge, no private address: all traffic stays on
//     loopback. scripts/test-containers runs the suite this way.
//
// IDEMKIT_POSTGRES_IMAGE and IDEMKIT_KAFKA_IMAGE name other images in either
// way. The reaper (Ryuk) is testcontainers' own setting:
// TESTCONTAINERS_RYUK_DISABLED=true where no image of it can be had.
package containers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/idemkit/idemkit/internal/testenv"
)

// Default images, used when IDEMKIT_POSTGRES_IMAGE / IDEMKIT_KAFKA_IMAGE are
// unset. The testcontainers Kafka module (v0.40, as go.mod requires) runs
// only confluent-local images; 7.9 carries Apache Kafka 3.9
// in KRaft mode. In host mode the defaults are the local images of
// scripts/containers-images, which carry Kafka 4.1 like scripts/dev.
const (
	PostgresImage = "postgres:15"
	KafkaImage    = "confluentinc/confluent-local:7.9.0"

	HostPostgresImage = "idemkit/postgres:15"
	HostKafkaImage    = "idemkit/kafka:4.1.1"
)

// The environment variables this package reads.
const (
	EnvPostgresImage = "IDEMKIT_POSTGRES_IMAGE"
	EnvKafkaImage    = "IDEMKIT_KAFKA_IMAGE"
	EnvNetwork       = "IDEMKIT_CONTAINERS_NETWORK"
	EnvPGPort        = "IDEMKIT_CONTAINERS_PG_PORT"
	EnvKafkaPort     = "IDEMKIT_CONTAINERS_KAFKA_PORT"
	EnvKafkaSASLPort = "IDEMKIT_CONTAINERS_KAFKA_SASL_PORT"
)

// Ports of host mode when the environment names none: clear of scripts/dev's
// (54329, 19092-19094, 16379).
const (
	DefaultHostPGPort    = 55432
	DefaultHostKafkaPort = 29092
)

// ErrNoDocker means no Docker engine answered.
var ErrNoDocker = errors.New("no Docker engine is reachable")

// Config says which images run, and how.
type Config struct {
	PostgresImage string
	KafkaImage    string
	// HostNetwork runs both containers on the host's network (images of the
	// scripts/containers contract), on 127.0.0.1:PGPort and
	// 127.0.0.1:KafkaPort (and KafkaPort+1, the controller).
	HostNetwork bool
	PGPort      int
	KafkaPort   int
	// KafkaSASLPort, in host mode, is the broker's SASL_SSL listener
	// (SCRAM-SHA-256/512 and PLAIN for the user alice, TLS with a CA the
	// container makes): KafkaPort+2 unless IDEMKIT_CONTAINERS_KAFKA_SASL_PORT
	// names another.
	KafkaSASLPort int
}

// SASL is the SASL_SSL listener of a host-mode broker, in the terms of the
// tests' IDEMKIT_TEST_KAFKA_SASL_* variables.
type SASL struct {
	Brokers  string
	CAFile   string // the CA's PEM, copied out of the container
	User     string
	Password string
}

// ConfigFromEnv reads Config from the environment (see the package comment).
func ConfigFromEnv() (Config, error) {
	c := Config{PostgresImage: PostgresImage, KafkaImage: KafkaImage}
	switch n := strings.TrimSpace(os.Getenv(EnvNetwork)); n {
	case "", "bridge", "default":
	case "host":
		c.HostNetwork = true
		c.PostgresImage, c.KafkaImage = HostPostgresImage, HostKafkaImage
		var err error
		if c.PGPort, err = port(EnvPGPort, DefaultHostPGPort); err != nil {
			return Config{}, err
		}
		if c.KafkaPort, err = port(EnvKafkaPort, DefaultHostKafkaPort); err != nil {
			return Config{}, err
		}
		if c.KafkaSASLPort, err = port(EnvKafkaSASLPort, c.KafkaPort+2); err != nil {
			return Config{}, err
		}
	default:
		return Config{}, fmt.Errorf("%s=%q: want host or nothing", EnvNetwork, n)
	}
	if v := strings.TrimSpace(os.Getenv(EnvPostgresImage)); v != "" {
		c.PostgresImage = v
	}
	if v := strings.TrimSpace(os.Getenv(EnvKafkaImage)); v != "" {
		c.KafkaImage = v
	}
	return c, nil
}

func port(env string, def int) (int, error) {
	v := strings.TrimSpace(os.Getenv(env))
	if v == "" {
		return def, nil
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65534 {
		return 0, fmt.Errorf("%s=%q: want a port number", env, v)
	}
	return p, nil
}

// Start is a testenv.Starter: it starts both servers in containers, as the
// environment says (ConfigFromEnv).
func Start(ctx context.Context) (testenv.Servers, func(), error) {
	c, err := ConfigFromEnv()
	if err != nil {
		return testenv.Servers{}, nil, err
	}
	s, _, stop, err := StartWith(ctx, c)
	return s, stop, err
}

// StartWith starts both servers in containers as c says. The SASL listener
// is nil but in host mode.
func StartWith(ctx context.Context, c Config) (testenv.Servers, *SASL, func(), error) {
	s, stop, err := startWith(ctx, c)
	return s.Servers, s.SASL, stop, err
}

type started struct {
	testenv.Servers
	SASL *SASL
}

func startWith(ctx context.Context, c Config) (started, func(), error) {
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return started{}, nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	if err := provider.Health(ctx); err != nil {
		_ = provider.Close()
		return started{}, nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	_ = provider.Close()
	if c.HostNetwork {
		return startHost(ctx, c)
	}

	pg, err := tcpostgres.Run(ctx, c.PostgresImage,
		tcpostgres.WithDatabase("idemkit"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return started{}, nil, fmt.Errorf("start postgres container (%s): %w", c.PostgresImage, err)
	}
	stopPG := func() { _ = testcontainers.TerminateContainer(pg) }
	url, err := pg.ConnectionString(ctx, "sslmode=disable", "connect_timeout=10")
	if err != nil {
		stopPG()
		return started{}, nil, fmt.Errorf("postgres container address: %w", err)
	}
	kc, err := tckafka.Run(ctx, c.KafkaImage, tckafka.WithClusterID("idemkit-test"))
	if err != nil {
		stopPG()
		return started{}, nil, fmt.Errorf("start kafka container (%s): %w", c.KafkaImage, err)
	}
	brokers, err := kc.Brokers(ctx)
	stop := func() { _ = testcontainers.TerminateContainer(kc); stopPG() }
	if err != nil {
		stop()
		return started{}, nil, fmt.Errorf("kafka container address: %w", err)
	}
	return started{Servers: testenv.Servers{DatabaseURL: url, Brokers: brokers}}, stop, nil
}

// startHost runs the images of the scripts/containers contract on the host's
// network: each listens on 127.0.0.1 at the port its environment names.
func startHost(ctx context.Context, c Config) (started, func(), error) {
	for _, p := range []int{c.PGPort, c.KafkaPort, c.KafkaPort + 1, c.KafkaSASLPort} {
		if err := free(p); err != nil {
			return started{}, nil, err
		}
	}
	pg, err := runHost(ctx, testcontainers.ContainerRequest{
		Image: c.PostgresImage,
		Env:   map[string]string{"PG_PORT": strconv.Itoa(c.PGPort), "POSTGRES_DB": "idemkit"},
		WaitingFor: wait.ForLog("database system is ready to accept connections").
			WithStartupTimeout(2 * time.Minute),
	})
	if err != nil {
		return started{}, nil, fmt.Errorf("start postgres container (%s, host network, port %d): %w", c.PostgresImage, c.PGPort, err)
	}
	stopPG := func() { _ = testcontainers.TerminateContainer(pg) }
	var secret [16]byte
	if _, err := rand.Read(secret[:]); err != nil {
		stopPG()
		return started{}, nil, err
	}
	sasl := &SASL{Brokers: fmt.Sprintf("127.0.0.1:%d", c.KafkaSASLPort), User: "alice", Password: hex.EncodeToString(secret[:])}
	kc, err := runHost(ctx, testcontainers.ContainerRequest{
		Image: c.KafkaImage,
		Env: map[string]string{"KAFKA_PORT": strconv.Itoa(c.KafkaPort),
			"KAFKA_SASL_PORT": strconv.Itoa(c.KafkaSASLPort), "KAFKA_SASL_PASSWORD": sasl.Password},
		WaitingFor: wait.ForLog("Kafka Server started").WithStartupTimeout(3 * time.Minute),
	})
	if err != nil {
		stopPG()
		return started{}, nil, fmt.Errorf("start kafka container (%s, host network, port %d): %w", c.KafkaImage, c.KafkaPort, err)
	}
	stopKafka := func() { _ = testcontainers.TerminateContainer(kc); stopPG() }
	ca, err := copyCA(ctx, kc)
	if err != nil {
		stopKafka()
		return started{}, nil, fmt.Errorf("kafka container's CA: %w", err)
	}
	sasl.CAFile = ca
	stop := func() { stopKafka(); _ = os.Remove(ca) }
	return started{Servers: testenv.Servers{
		DatabaseURL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/idemkit?sslmode=disable&connect_timeout=10", c.PGPort),
		Brokers:     []string{fmt.Sprintf("127.0.0.1:%d", c.KafkaPort)},
	}, SASL: sasl}, stop, nil
}

// copyCA copies the CA of the broker's SASL_SSL listener out of the
// container into a file of its own.
func copyCA(ctx context.Context, kc testcontainers.Container) (string, error) {
	r, err := kc.CopyFileFromContainer(ctx, "/var/lib/kafka/tls/ca.pem")
	if err != nil {
		return "", err
	}
	defer r.Close()
	pem, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "idemkit-containers-ca-*.pem")
	if err != nil {
		return "", err
	}
	if _, err := f.Write(pem); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return "", err
	}
	return f.Name(), f.Close()
}

// runHost creates and starts one container on the host's network. Its
// provider takes "host" for Docker's default network: testcontainers-go
// otherwise attaches every container to the "bridge" network and, where
// there is none (dockerd --bridge=none), creates a bridge network of its own
// (reaper_default) on a private range, which host mode must never do.
func runHost(ctx context.Context, req testcontainers.ContainerRequest) (testcontainers.Container, error) {
	p, err := testcontainers.NewDockerProvider(testcontainers.WithDefaultBridgeNetwork("host"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	req.HostConfigModifier = func(h *container.HostConfig) {
		h.NetworkMode = "host"
		h.ShmSize = 256 << 20
	}
	ctr, err := p.RunContainer(ctx, req)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, err
	}
	return ctr, nil
}

// free fails when something already listens on 127.0.0.1:p (such as the
// servers of scripts/dev).
func free(p int) error {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return fmt.Errorf("port %d on 127.0.0.1 is taken (set %s / %s): %w", p, EnvPGPort, EnvKafkaPort, err)
	}
	return l.Close()
}
