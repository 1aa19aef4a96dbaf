package console

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// EnvScreenshots names the folder the browser test saves its screenshots
// in (docs/console for the README); by default they go to a temporary
// folder.
const EnvScreenshots = "IDEMKIT_CONSOLE_SCREENSHOTS"

// chromium finds Debian's chromium, or fails with the fix.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the browser test needs Chromium: run scripts/dev chromium (Debian's chromium package)")
	return ""
}

// browser starts headless Chromium with a fresh profile, talking to
// loopback only, and collects the errors its console shows (console.error
// calls, exceptions, the browser's own log: a CSP violation, a resource that
// failed to load).
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil { // starts the browser and its tab
		cancelCtx()
		cancelAlloc()
		t.Fatalf("start Chromium: %v", err)
	}
	var mu sync.Mutex
	var errs []string
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return // the context ended
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s: %s (%s)", m.Type, m.Text, m.URL))
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
		<-done
	})
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

// unlabelled is a script that lists the visible form controls without a
// label (a <label>, aria-label or aria-labelledby).
const unlabelled = `Array.from(document.querySelectorAll('input, select, textarea, button'))
	.filter(el => el.type !== 'hidden')
	.filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby')
		&& !(el.tagName === 'BUTTON' && el.textContent.trim()))
	.map(el => el.outerHTML)`

// TestBrowserReplayAfterFix drives the console in headless Chromium: a
// consumer dead-letters the messages its handler refuses; an operator
// signs in, filters the dead letters, dry-runs their replay, and — once
// the handler is fixed — replays them, sees them applied and the audit
// entry. Each page is screenshotted; no page logs a browser error, and
// every form control has a label.
func TestBrowserReplayAfterFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "payments"}.Sanitize()+` (id text PRIMARY KEY)`)
		return err
	})
	topic, group := testenv.NewTopic(t, 1), testenv.Name(t, "g")
	dead := topic + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	tables := migrate.Tables{Schema: db.Schema}
	store, err := dedup.New(&dedup.Config{Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	// The handler refuses the payments whose order it does not know, until
	// it is fixed.
	var fixed atomic.Bool
	handler := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if strings.HasPrefix(string(m.Value), "unknown-order") && !fixed.Load() {
			return retry.Permanent(fmt.Errorf("no order for payment %s", m.ID))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("payments")+` (id) VALUES ($1)`, m.ID)
		return err
	})
	writer, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Topic: dead, Group: group, Consumer: group})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	runner, err := consumer.New(db.Pool, &consumer.Config{Kafka: testenv.Kafka(t), Topic: topic, GroupID: group, Store: store,
		Handler: handler, OnFailure: writer.OnFailure})
	if err != nil {
		t.Fatal(err)
	}
	var records []kafka.Record
	for i := range 5 {
		value := "order-paid"
		if i%2 == 1 {
			value = "unknown-order"
		}
		records = append(records, kafka.Record{Value: kafka.NewBytes([]byte(value)),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: fmt.Appendf(nil, "pay-%d", i)}}})
	}
	testenv.Produce(t, topic, 0, records...)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("runner: %v", err)
		}
	}()
	payments := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("payments")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "3 payments applied and 2 dead letters", func() bool {
		l, err := dlq.List(ctx, nil, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{dead}, NoPayload: true})
		return err == nil && payments() == 3 && len(l.Messages) == 2
	})

	c, err := New(db.Pool, &Config{Kafka: testenv.Kafka(t), Tables: tables, Authorize: TokenAuth(testToken, testName),
		DLQSuffix: dead, Redrive: map[string]consumer.Handler{dead: handler}, Thresholds: Thresholds{MaxLag: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c) // 127.0.0.1
	defer srv.Close()

	shots := os.Getenv(EnvScreenshots)
	if shots == "" {
		shots = t.TempDir()
	}
	bctx, consoleErrors := browser(t)
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644)
		})
	}
	labelled := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		bad, err := chromedp.Evaluate[[]string](unlabelled)(ctx, tg)
		if err != nil {
			return err
		}
		if len(bad) > 0 {
			loc, _ := chromedp.Location()(ctx, tg)
			return fmt.Errorf("%s: form controls without a label: %v", loc, bad)
		}
		return nil
	})
	// poll waits until expr is true in the page, across navigations (an
	// evaluation in a page being replaced fails, and is tried again).
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			var last error
			for range 600 {
				ok, err := chromedp.Evaluate[bool](expr)(ctx, tg)
				if err == nil && ok {
					return nil
				}
				last = err
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(100 * time.Millisecond):
				}
			}
			loc, _ := chromedp.Location()(ctx, tg)
			return fmt.Errorf("%s never held on %s (%v)", expr, loc, last)
		})
	}
	title := func(part string) chromedp.Action[chromedp.Void] {
		return poll(fmt.Sprintf(`document.title.includes(%q)`, part))
	}
	var main string
	text := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		var err error
		main, err = chromedp.Text(chromedp.CSS("main"))(ctx, tg)
		return err
	})
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	run("sign in", chromedp.Navigate(srv.URL+"/"), title("Sign in"), labelled, shot("login"),
		chromedp.SendKeys(chromedp.ID("token"), testToken), chromedp.Submit(chromedp.ID("token")), title("Overview"),
		labelled, text, shot("overview"))
	if !strings.Contains(main, dead) || !strings.Contains(main, "2") {
		t.Fatalf("overview:\n%s", main)
	}
	run("open the dead letters", chromedp.Click(chromedp.CSS(`a[href="/dlq/`+url.PathEscape(dead)+`"]`)), title(dead),
		chromedp.SendKeys(chromedp.ID("f-error"), "no order"), chromedp.SendKeys(chromedp.ID("f-class"), "permanent"),
		chromedp.Click(chromedp.CSS(`form.filters button[type=submit]`)),
		poll(`location.search.includes("class=permanent")`), chromedp.WaitReady(chromedp.CSS("main table")),
		labelled, text, shot("dead-letters"))
	if !strings.Contains(main, "2 dead letter(s) selected") || !strings.Contains(main, "pay-1") || !strings.Contains(main, "pay-3") {
		t.Fatalf("filtered list:\n%s", main)
	}
	var list string
	run("open a letter", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		var err error
		list, err = chromedp.Location()(ctx, tg)
		return err
	}), chromedp.Click(chromedp.CSS(`a[href$="/0/0"]`)), title("/0"), labelled, text, shot("dead-letter"))
	run("back to the list", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Navigate(list)(ctx, tg)
		return err
	}), title(dead))
	if !strings.Contains(main, "no order for payment") {
		t.Fatalf("letter:\n%s", main)
	}
	run("dry run", chromedp.Click(chromedp.CSS(`button[value=filtered]`)), title("dry run"), labelled,
		text, shot("replay-dry-run"))
	if !strings.Contains(main, "Dry run: nothing was changed") || strings.Count(main, "would-replay") < 2 {
		t.Fatalf("dry run:\n%s", main)
	}
	if n := payments(); n != 3 {
		t.Fatalf("a dry run applied payments: %d", n)
	}
	fixed.Store(true) // the handler's fix is deployed
	run("replay", chromedp.Click(chromedp.CSS(`button.danger`)),
		poll(`document.title.startsWith("Replay") && !document.title.includes("dry run")`),
		text, shot("replay"))
	if !strings.Contains(main, "done (audit entry") || !strings.Contains(main, "2 applied") {
		t.Fatalf("replay:\n%s", main)
	}
	if n := payments(); n != 5 {
		t.Fatalf("%d payments after the replay, want 5", n)
	}
	run("see them applied", chromedp.Navigate(srv.URL+"/dlq/"+url.PathEscape(dead)), title(dead),
		text)
	if !strings.Contains(main, "Origin messages: 2 applied") {
		t.Fatalf("after the replay:\n%s", main)
	}
	run("audit", chromedp.Click(chromedp.CSS(`a[href="/audit"]`)), title("Audit"), labelled,
		text, shot("audit"))
	if !strings.Contains(main, "dlq.replay") || !strings.Contains(main, testName) || !strings.Contains(main, "done") {
		t.Fatalf("audit:\n%s", main)
	}
	run("other pages",
		chromedp.Click(chromedp.CSS(`a[href="/consumers"]`)), title("Consumers"), labelled, shot("consumers"),
		chromedp.Click(chromedp.CSS(`main a[href^="/consumers/"]`)), title(" on "), labelled, shot("consumer"),
		chromedp.Click(chromedp.CSS(`a[href="/outbox"]`)), title("Outbox"), labelled, shot("outbox"),
		chromedp.Click(chromedp.CSS(`a[href="/idemhttp"]`)), title("HTTP idempotency"), labelled, shot("idemhttp"))
	if errs := consoleErrors(); len(errs) > 0 {
		t.Fatalf("browser errors: %v", errs)
	}
}

// waitFor polls cond, which reads the servers' state, until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
