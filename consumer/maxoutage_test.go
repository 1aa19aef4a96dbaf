package consumer_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// proxy forwards TCP to target until closed; closing drops every connection
// and refuses new ones.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// TestMaxOutageBoundsPostgresOutage: PostgreSQL goes away for good while a
// message is to be processed; with MaxOutage 2s, Run returns a
// *retry.OutageError within a few seconds: the outage error itself is not
// taken for a new outage to wait out.
func TestMaxOutageBoundsPostgresOutage(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			u, err := url.Parse(testenv.DatabaseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			px := newProxy(t, u.Host)
			u.Host = px.ln.Addr().String()
			pcfg, err := pgxpool.ParseConfig(u.String())
			if err != nil {
				t.Fatal(err)
			}
			pcfg.ConnConfig.RuntimeParams["search_path"] = ""
			pcfg.ConnConfig.ConnectTimeout = time.Second
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()

			e.produce(msg("m1", "k", 1))
			applied := make(chan struct{})
			var once sync.Once
			cfg := e.config(md, nil)
			cfg.MaxOutage = 2 * time.Second
			cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
			testobs.Of(cfg).OnAfterCommit = func(context.Context, []*consumer.Message) { once.Do(func() { close(applied) }) }
			r, err := consumer.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			wait(t, applied, "m1")
			px.close()
			e.produce(msg("m2", "k", 1))
			start := time.Now()
			select {
			case err := <-errc:
				t.Logf("Run returned after %v: %v", time.Since(start), err)
				if !errors.Is(err, retry.ErrOutage) {
					t.Fatalf("want ErrOutage")
				}
			case <-time.After(25 * time.Second):
				cancel()
				<-errc
				t.Fatalf("Run did not return 25s after PostgreSQL went away with MaxOutage 2s")
			}
		})
	}
}
