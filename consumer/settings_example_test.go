package consumer_test

import (
	"context"
	"log"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A pool whose sessions end a transaction their client left idle, and
// whose connections notice a peer gone silent: the settings the runner
// warns about at start when they are off (see docs/network-faults.md).
func Example_sessionSettings() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		log.Fatal(err)
	}
	for k, v := range map[string]string{
		"idle_in_transaction_session_timeout": "60s",
		"tcp_keepalives_idle":                 "15",
		"tcp_keepalives_interval":             "5",
		"tcp_keepalives_count":                "3",
	} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	cfg.ConnConfig.DialFunc = (&net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}}).DialContext
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
}
