package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// TestServiceRunsEndToEnd runs the service against the test servers: a
// payment event delivered twice marks its order paid once and announces it
// once through the outbox; an event for an unknown order announces nothing
// (it is dead-lettered); the service stops cleanly when its context ends.
// Its pool is bounded as docs/network-faults.md says, from a plain URL: no
// start-up check warns about its sessions.
func TestServiceRunsEndToEnd(t *testing.T) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("orders")+` (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("orders")+` VALUES ('o-1', 'open')`); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("connect_timeout") // the service sets it itself
	u.RawQuery = q.Encode()
	t.Setenv("DATABASE_URL", u.String())
	logs := &syncBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, nil)))
	defer slog.SetDefault(prev)
	t.Setenv("KAFKA_BROKERS", testenv.Brokers(t)[0])
	t.Setenv("SCHEMA", db.Schema)
	t.Setenv("METRICS_ADDR", addr)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	// The service creates its topics; a new event ID per test run, sent twice.
	eventID := testenv.Name(t, "settled")
	waitTopic(t, "payments")
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: "payments", RequiredAcks: kafka.RequireAll}
	defer w.Close()
	event := kafka.Message{Key: []byte("o-1"), Value: []byte(`{"event_id":"` + eventID + `","amount":100}`)}
	unknown := kafka.Message{Key: []byte("o-404"), Value: []byte(`{"event_id":"` + eventID + `-404","amount":1}`)}
	if err := w.WriteMessages(ctx, event, event, unknown); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var status string
		var published, enqueued int
		err := db.Pool.QueryRow(ctx, `SELECT (SELECT status FROM `+db.Table("orders")+` WHERE id = 'o-1'),
			(SELECT count(*) FROM `+db.Table("idemkit_outbox")+`),
			(SELECT count(*) FROM `+db.Table("idemkit_outbox")+` WHERE published_at IS NOT NULL)`).Scan(&status, &enqueued, &published)
		if err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		if status == "paid" && enqueued == 1 && published == 1 && deadLettered(t, eventID+"-404") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: order %q, %d OrderPaid enqueued, %d published; want paid, 1, 1", status, enqueued, published)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, warn := range []string{pgsession.WarnMsg, pgsession.DialWarnMsg} {
		if strings.Contains(logs.String(), warn) {
			t.Errorf("the service's pool is not bounded: it logged %q\n%s", warn, logs.String())
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the service's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitTopic waits until topic exists (the service creates it at start).
func waitTopic(t *testing.T, topic string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		tr := &kafka.Transport{}
		client := &kafka.Client{Addr: kafka.TCP(testenv.Brokers(t)...), Transport: tr}
		md, err := client.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		tr.CloseIdleConnections()
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s not created within a minute: %v", topic, err)
		}
	}
}

// deadLettered reports whether payments.dlq holds the event with id.
func deadLettered(t *testing.T, id string) bool {
	t.Helper()
	for _, m := range testenv.ReadAll(t, testenv.Brokers(t), "payments.dlq") {
		if strings.Contains(string(m.Value), `"event_id":"`+id+`"`) {
			return true
		}
	}
	return false
}
