package idemhttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

const (
	helperSchemaEnv = "IDEMHTTP_HELPER_SCHEMA"
	// helperClockEnv, when set, is a duration the helper server's store
	// clock runs ahead of real time.
	helperClockEnv = "IDEMHTTP_HELPER_CLOCK_AHEAD"
	// helperRecordEnv, when set, makes the helper server reserve keys with a
	// record of their own (Config.NoLeaseTakeover).
	helperRecordEnv = "IDEMHTTP_HELPER_RECORD=1"
)

// TestHelperServer is the server process of TestRestart: it runs only when
// that test starts this binary with helperSchemaEnv set. It prints "ADDR
// host:port" when it listens, "HANG" when a request with X-Hang reaches the
// handler (after its insert), and serves until stdin closes or it is killed.
func TestHelperServer(t *testing.T) {
	schema := os.Getenv(helperSchemaEnv)
	if schema == "" {
		return // not a subprocess of TestRestart
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	now := time.Now
	if v := os.Getenv(helperClockEnv); v != "" {
		ahead, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		now = func() time.Time { return time.Now().Add(ahead) }
	}
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: schema}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(pool, &idemhttp.Config{Store: store, Account: accountFromHeader, FingerprintKeys: testKeys, Lease: 30 * time.Second,
		NoLeaseTakeover: os.Getenv("IDEMHTTP_HELPER_RECORD") != ""})
	if err != nil {
		t.Fatal(err)
	}
	payments := pgx.Identifier{schema, "payments"}.Sanitize()
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req paymentRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		tx, _ := idemhttp.Tx(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+payments+" (account, order_id, amount) VALUES ($1, $2, $3) RETURNING id",
			r.Header.Get("X-Account"), req.OrderID, req.Amount).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.Header.Get("X-Hang") != "" {
			fmt.Println("HANG")
			<-r.Context().Done() // until the process is killed (or the lease ends)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(paymentResponse{ID: id, Account: r.Header.Get("X-Account"), OrderID: req.OrderID,
			Amount: req.Amount})
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Printf("ADDR %s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	<-served
}

// serverProcess is a running TestHelperServer.
type serverProcess struct {
	cmd   *exec.Cmd
	url   string
	lines chan string // stdout lines after ADDR; closed at EOF
}

// startServerProcess starts a TestHelperServer on schema; env adds
// variables (helperClockEnv).
func startServerProcess(t *testing.T, schema string, env ...string) *serverProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), helperSchemaEnv+"="+schema), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = stdin // closed by Wait; killing is what ends the process here
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProcess{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(p.kill)
	for {
		line, ok := p.next(t)
		if !ok {
			t.Fatal("server process exited before listening")
		}
		if addr, found := strings.CutPrefix(line, "ADDR "); found {
			p.url = "http://" + addr
			return p
		}
	}
}

// next returns the next stdout line, waiting up to a minute.
func (p *serverProcess) next(t *testing.T) (string, bool) {
	t.Helper()
	select {
	case line, ok := <-p.lines:
		return line, ok
	case <-time.After(time.Minute):
		t.Fatal("server process silent for a minute")
		return "", false
	}
}

// kill ends the process with SIGKILL: a crash, no cleanup.
func (p *serverProcess) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	for range p.lines { // drain until EOF so the reader goroutine ends
	}
	_ = p.cmd.Wait()
}

// crashDuring sends a request with key to p that hangs in the handler after
// its insert, and kills p (SIGKILL) while it hangs.
func crashDuring(t *testing.T, p *serverProcess, client *http.Client, key string) {
	t.Helper()
	failed := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, p.url+"/payments", strings.NewReader(payment))
		req.Header.Set(idemhttp.HeaderKey, key)
		req.Header.Set("X-Account", "acct-1")
		req.Header.Set("X-Hang", "1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			err = fmt.Errorf("got status %d", resp.StatusCode)
		}
		failed <- err
	}()
	if line, _ := p.next(t); line != "HANG" {
		t.Fatalf("server printed %q, want HANG", line)
	}
	p.kill()
	<-failed // the connection died with the process
}

// A stored response survives a crash and restart of
// the server process; a request in flight when the process died leaves its
// record PROCESSING, the reconciler allows a retry once the lease ended, and
// the crashed request's writes were never committed.
func TestRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, migrated)
	count := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("payments")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	key := newKey()
	client := newClient(t)

	p1 := startServerProcess(t, db.Schema, helperRecordEnv)
	first, err := postTo(ctx, client, p1.url+"/payments", key, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	want(t, first, http.StatusCreated, false)
	p1.kill()

	p2 := startServerProcess(t, db.Schema, helperRecordEnv)
	r, err := postTo(ctx, client, p2.url+"/payments", key, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	want(t, r, http.StatusCreated, true)
	if r.body != first.body {
		t.Fatalf("replay after restart %v, want %v", r, first)
	}

	// A request in flight when the process crashes.
	hangKey := newKey()
	crashDuring(t, p2, client, hangKey)
	if n := count(); n != 1 {
		t.Fatalf("payments = %d after the crash, want 1 (the crashed insert was never committed)", n)
	}

	p3 := startServerProcess(t, db.Schema, helperRecordEnv)
	r, err = postTo(ctx, client, p3.url+"/payments", hangKey, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r, http.StatusConflict, idemhttp.CodeInFlight) // its lease has not ended

	// 31 s later (on an injected clock), the reconciler gets the record.
	later := &clock{offset: 31 * time.Second}
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}, Now: later.Now})
	if err != nil {
		t.Fatal(err)
	}
	stuck, err := store.FindStuck(ctx, db.Pool, 0)
	if err != nil || len(stuck) != 1 || stuck[0].Key != hangKey {
		t.Fatalf("FindStuck = %+v, %v; want the crashed request's record", stuck, err)
	}
	n, err := store.Reconcile(ctx, db.Pool, idemhttp.ReconcilerFunc(
		func(context.Context, idemhttp.Record) (idemhttp.Decision, error) { return idemhttp.AllowRetry, nil }), 0)
	if n != 1 || err != nil {
		t.Fatalf("Reconcile = %d, %v", n, err)
	}
	r, err = postTo(ctx, client, p3.url+"/payments", hangKey, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	want(t, r, http.StatusCreated, false)
	if n := count(); n != 2 {
		t.Fatalf("payments = %d, want 2", n)
	}
}

// With a real crash, in the default layout: a server
// process killed while its handler runs holds its key only as long as its
// PostgreSQL session lives, and the session ends with the process. So the
// next request with the key runs at once, long before the lease (30 s)
// would end, and once; later requests get the replay.
func TestCrashedHolderTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, migrated)
	count := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("payments")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	key := newKey()
	client := newClient(t)
	crashDuring(t, startServerProcess(t, db.Schema), client, key)
	killed := time.Now()
	if n := count(); n != 0 {
		t.Fatalf("payments = %d after the crash, want 0", n)
	}

	p2 := startServerProcess(t, db.Schema)
	var first response
	for {
		r, err := postTo(ctx, client, p2.url+"/payments", key, "acct-1", payment)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusConflict || time.Since(killed) > 20*time.Second {
			first = r
			break
		}
		time.Sleep(20 * time.Millisecond) // the killed session may take an instant to end
	}
	want(t, first, http.StatusCreated, false)
	for range 2 {
		r, err := postTo(ctx, client, p2.url+"/payments", key, "acct-1", payment)
		if err != nil {
			t.Fatal(err)
		}
		want(t, r, http.StatusCreated, true)
		if r.body != first.body {
			t.Fatalf("replay %v, want %v", r, first)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("payments = %d, want 1", n)
	}
}
