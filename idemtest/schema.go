package idemtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/migrate"
)

// cleanupTimeout bounds what a test's cleanup does: dropping a schema,
// deleting a topic. The test's own context has ended by then.
const cleanupTimeout = 30 * time.Second

// Schema is a PostgreSQL schema of its own for one test, with every idemkit
// migration applied (processed messages, positions, outbox, HTTP
// idempotency records, parked messages, dead-letter replays).
type Schema struct {
	// Name is the schema's name, unquoted: pass it as the Schema of
	// dedup.Config, outbox.Config, idemhttp.StoreConfig and migrate.Config.
	Name string

	pool *pgxpool.Pool
}

// Table returns the schema-qualified, quoted name of a table in the schema,
// for the test's own tables: `CREATE TABLE ` + s.Table("orders") + ` (…)`.
func (s *Schema) Table(name string) string { return pgx.Identifier{s.Name, name}.Sanitize() }

// CreateSchema creates a schema with a fresh random name on pool's
// database and migrates it to the latest version. Drop removes it. It is
// the form for Example functions and TestMain, which have no testing.TB;
// tests call NewSchema.
func CreateSchema(ctx context.Context, pool *pgxpool.Pool) (*Schema, error) {
	if pool == nil {
		return nil, fmt.Errorf("idemtest: create schema: %w: nil pool", idemkit.ErrInvalidConfig)
	}
	s := &Schema{Name: "idemtest_" + randomSuffix(), pool: pool}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s.Name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("idemtest: create schema %s: %w", s.Name, err)
	}
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err != nil {
		_ = s.Drop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("idemtest: migrate schema %s: %w", s.Name, err)
	}
	return s, nil
}

// Drop drops the schema and everything in it.
func (s *Schema) Drop(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s.Name}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("idemtest: drop schema %s: %w", s.Name, err)
	}
	return nil
}

// NewSchema is CreateSchema for a test: it stops the test (Fatalf) when the
// schema cannot be made, and drops the schema when the test ends (before
// pool is closed, when pool's own cleanup was registered first).
func NewSchema(tb testing.TB, pool *pgxpool.Pool) *Schema {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	s, err := CreateSchema(ctx, pool)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := s.Drop(ctx); err != nil {
			tb.Errorf("%v", err)
		}
	})
	return s
}

// CreateTopic creates a topic with a fresh random name and the given number
// of partitions (replication factor 1) on brokers, and waits until every
// partition has a leader. drop deletes it. It connects without TLS or SASL.
func CreateTopic(ctx context.Context, brokers []string, partitions int) (topic string, drop func(context.Context) error, err error) {
	if len(brokers) == 0 || partitions < 1 {
		return "", nil, fmt.Errorf("idemtest: create topic: %d brokers, %d partitions", len(brokers), partitions)
	}
	topic = "idemtest_" + randomSuffix()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return "", nil, fmt.Errorf("idemtest: create topic %s: %w", topic, err)
	}
	drop = func(ctx context.Context) error {
		resp, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
		if err == nil {
			err = resp.Errors[topic]
		}
		if err != nil {
			return fmt.Errorf("idemtest: delete topic %s: %w", topic, err)
		}
		return nil
	}
	if err := waitTopic(ctx, client, topic, partitions); err != nil {
		_ = drop(context.WithoutCancel(ctx))
		return "", nil, err
	}
	return topic, drop, nil
}

// NewTopic is CreateTopic for a test: it stops the test (Fatalf) when the
// topic cannot be made, and deletes the topic when the test ends.
func NewTopic(tb testing.TB, brokers []string, partitions int) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	topic, drop, err := CreateTopic(ctx, brokers, partitions)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := drop(ctx); err != nil {
			tb.Errorf("%v", err)
		}
	})
	return topic
}

// waitTopic waits until the topic's metadata lists partitions partitions,
// each with a leader.
func waitTopic(ctx context.Context, client *kafka.Client, topic string, partitions int) error {
	var last error
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		switch {
		case err != nil:
			last = err
		case len(md.Topics) != 1:
			last = errors.New("topic not in the metadata yet")
		case md.Topics[0].Error != nil:
			last = md.Topics[0].Error
		default:
			ready := 0
			for _, p := range md.Topics[0].Partitions {
				if p.Error == nil && p.Leader.ID >= 0 && p.Leader.Host != "" {
					ready++
				}
			}
			if ready == partitions {
				return nil
			}
			last = fmt.Errorf("%d of %d partitions have a leader", ready, partitions)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("idemtest: topic %s not ready: %v: %w", topic, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// randomSuffix is 12 random characters (lower-case base32), safe in a
// PostgreSQL identifier and a Kafka topic name.
func randomSuffix() string { return strings.ToLower(rand.Text())[:12] }
