package pgproc

// Tests of scripts/dev's PostgreSQL pair (replica, replica-failover,
// replica-stop), not of this package: they live here because the package
// already needs the server binaries and the postgres user, and gives the
// folder and ports. Each runs the script on a folder and two ports of its
// own; the shared dev servers are never touched.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// devScript is scripts/dev on its own folder and ports.
type devScript struct {
	t      *testing.T
	path   string // scripts/dev
	dev    string // IDEMKIT_DEV_DIR
	ports  [2]int // node-a, node-b
	bin    string
	cred   *syscall.Credential
	ctx    context.Context
	failed bool
}

func newDevScript(t *testing.T, ctx context.Context) *devScript {
	t.Helper()
	path, err := filepath.Abs("../../../scripts/dev")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := Bin()
	if err != nil {
		t.Fatal(err)
	}
	cred, err := owner()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := makeDir(cred)
	if err != nil {
		t.Fatal(err)
	}
	d := &devScript{t: t, path: path, dev: filepath.Join(dir, "dev"), bin: bin, cred: cred, ctx: ctx}
	t.Cleanup(func() {
		// Its own context: the test's may have ended.
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := d.runCtx(cctx, "replica-stop"); err != nil {
			t.Errorf("scripts/dev replica-stop: %v\n%s", err, out)
			for _, node := range []string{"node-a", "node-b"} {
				if pid, ok := d.postmaster(node); ok {
					_, _ = killTree(syscall.Kill, pid)
				}
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	for d.ports[0] == d.ports[1] {
		if d.ports[0], err = freePort(); err != nil {
			t.Fatal(err)
		}
		if d.ports[1], err = freePort(); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func (d *devScript) runCtx(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{d.path}, args...)...)
	cmd.Env = append(os.Environ(), "IDEMKIT_DEV_DIR="+d.dev,
		fmt.Sprintf("IDEMKIT_PG_REPLICA_PORTS=%d,%d", d.ports[0], d.ports[1]))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// run runs scripts/dev and fails the test unless it succeeds.
func (d *devScript) run(args ...string) string {
	d.t.Helper()
	out, err := d.runCtx(d.ctx, args...)
	if err != nil {
		d.t.Fatalf("scripts/dev %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// refused runs scripts/dev replica and fails the test unless it refuses
// with want in its message.
func (d *devScript) refused(want string) string {
	d.t.Helper()
	out, err := d.runCtx(d.ctx, "replica")
	if err == nil || !strings.Contains(out, want) {
		d.t.Fatalf("scripts/dev replica: %v, want a refusal saying %q\n%s", err, want, out)
	}
	return out
}

func (d *devScript) data(node string) string { return filepath.Join(d.dev, "replica", node, "data") }

func (d *devScript) url(node string) string {
	port := d.ports[0]
	if node == "node-b" {
		port = d.ports[1]
	}
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/idemkit?sslmode=disable&connect_timeout=10"
}

func (d *devScript) exec(node, sql string) {
	d.t.Helper()
	conn, err := pgx.Connect(d.ctx, d.url(node))
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(d.ctx))
	if _, err := conn.Exec(d.ctx, sql); err != nil {
		d.t.Fatalf("%s on %s: %v", sql, node, err)
	}
}

// state returns node's rows in t, whether table after_failover exists and
// whether it is in recovery.
func (d *devScript) state(node string) (rows int, after, recovery bool) {
	d.t.Helper()
	conn, err := pgx.Connect(d.ctx, d.url(node))
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(d.ctx))
	err = conn.QueryRow(d.ctx, `SELECT (SELECT count(*) FROM t), to_regclass('after_failover') IS NOT NULL, pg_is_in_recovery()`).
		Scan(&rows, &after, &recovery)
	if err != nil {
		d.t.Fatalf("%s: %v", node, err)
	}
	return rows, after, recovery
}

func (d *devScript) postmaster(node string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(d.data(node), "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]))
	return pid, err == nil
}

// kill kills node's postmaster and backends (SIGKILL) and waits until none
// is left (a backend left alive would keep the shared memory that the next
// start refuses to share) and the postmaster is reaped: pg_ctl, and so
// scripts/dev, takes a postmaster.pid whose process exists, a zombie too, for
// a running server (init may reap orphans seconds late).
func (d *devScript) kill(node string) {
	d.t.Helper()
	pid, ok := d.postmaster(node)
	if !ok {
		d.t.Fatalf("%s has no postmaster.pid", node)
	}
	kids, err := killTree(syscall.Kill, pid)
	if err != nil {
		d.t.Fatal(err)
	}
	start := time.Now()
	defer func() {
		d.t.Logf("%s: postmaster %d and %d backends gone %v after SIGKILL", node, pid, len(kids), time.Since(start))
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		alive := 0
		for _, p := range kids {
			if st, _, ok := procStat(p); ok && st != 'Z' {
				alive++
			}
		}
		_, _, postmaster := procStat(pid)
		if alive == 0 && !postmaster {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s 30s after SIGKILL: %d backends run, postmaster %d exists: %v", node, alive, pid, postmaster)
		}
	}
}

// pgCtl runs pg_ctl on node's data as the cluster's owner.
func (d *devScript) pgCtl(node string, args ...string) {
	d.t.Helper()
	cmd := exec.CommandContext(d.ctx, filepath.Join(d.bin, "pg_ctl"), append([]string{"-D", d.data(node)}, args...)...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: d.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		d.t.Fatalf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

var checkpointTLI = regexp.MustCompile(`(?m)^Latest checkpoint's TimeLineID:\s*(\d+)$`)

// controlTLI is node's timeline as its control file says.
func (d *devScript) controlTLI(node string) string {
	d.t.Helper()
	out, err := exec.CommandContext(d.ctx, filepath.Join(d.bin, "pg_controldata"), "-D", d.data(node)).Output()
	m := checkpointTLI.FindSubmatch(out)
	if err != nil || m == nil {
		d.t.Fatalf("pg_controldata %s: %v\n%s", node, err, out)
	}
	return string(m[1])
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// TestDevReplicaChoosesPromotedNode: after a failover, the promoted node is
// killed before its first checkpoint, so that both control files still
// show timeline 1. scripts/dev replica must then restart the promoted node
// (its pg_wal/00000002.history says it is on timeline 2) and rebuild the old
// primary from it, keeping the commits made after the failover. It must
// refuse, deleting nothing, while the old primary runs again (started by
// hand), and when both nodes look like primaries on one timeline.
// 16 s alone, 56 s beside this package's other server tests, on two busy
// cores: it is part of the suite.
func TestDevReplicaChoosesPromotedNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d := newDevScript(t, ctx)

	if out := d.run("replica"); !strings.Contains(out, "ready: primary node-a") {
		t.Fatalf("scripts/dev replica on nothing: want node-a the primary\n%s", out)
	}
	d.exec("node-a", `CREATE TABLE t (n int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 1000)`)
	d.run("replica-failover")
	d.exec("node-b", `INSERT INTO t SELECT generate_series(1001, 20000); CREATE TABLE after_failover (n int)`)
	d.kill("node-b")
	// The tie of the defect: the promoted node's first checkpoint, a spread
	// one, has not completed.
	if a, b := d.controlTLI("node-a"), d.controlTLI("node-b"); a != "1" || b != "1" {
		t.Fatalf("control files' timelines: node-a %s, node-b %s; want 1 and 1 (the tie this test needs)", a, b)
	}
	history := filepath.Join(d.data("node-b"), "pg_wal", "00000002.history")
	if !exists(history) {
		t.Fatalf("the promoted node-b has no %s", history)
	}

	// The old primary started again by hand: it takes writes, but node-b
	// is on a later timeline.
	port := strconv.Itoa(d.ports[0])
	d.pgCtl("node-a", "-l", filepath.Join(d.dev, "replica", "node-a", "postgres.log"), "-w", "-t", "60", "start", "-o",
		"-c listen_addresses=127.0.0.1 -p "+port+" -c unix_socket_directories='"+d.data("node-a")+"'")
	d.refused("node-a runs as the primary on timeline 1, but node-b (stopped, no standby.signal) is on timeline 2")
	if !exists(history) || exists(filepath.Join(d.data("node-b"), "standby.signal")) {
		t.Fatal("the refusal touched node-b's data folder")
	}
	d.pgCtl("node-a", "-m", "fast", "-w", "stop")

	out := d.run("replica")
	if !strings.Contains(out, "ready: primary node-b") {
		t.Fatalf("scripts/dev replica after node-b's kill: want node-b the primary\n%s", out)
	}
	if rows, after, rec := d.state("node-b"); rows != 20000 || !after || rec {
		t.Fatalf("node-b: %d rows, after_failover %v, in recovery %v; want 20000, true, false", rows, after, rec)
	}
	if rows, after, rec := d.state("node-a"); rows != 20000 || !after || !rec {
		t.Fatalf("node-a: %d rows, after_failover %v, in recovery %v; want 20000, true, true (node-b's standby)", rows, after, rec)
	}

	// Both stopped, node-a's standby.signal gone: two primaries on
	// timeline 2 (node-a copied 00000002.history from node-b).
	d.run("replica-stop")
	if err := os.Remove(filepath.Join(d.data("node-a"), "standby.signal")); err != nil {
		t.Fatal(err)
	}
	out = d.refused("neither node has standby.signal and both are on timeline 2")
	for _, node := range []string{"node-a", "node-b"} {
		if !exists(filepath.Join(d.data(node), "PG_VERSION")) {
			t.Fatalf("the refusal deleted %s's data folder\n%s", node, out)
		}
		if _, ok := d.postmaster(node); ok {
			t.Fatalf("the refusal started %s\n%s", node, out)
		}
	}
	if conf, _ := os.ReadFile(filepath.Join(d.data("node-a"), "postgresql.auto.conf")); !bytes.Contains(conf, []byte("port="+strconv.Itoa(d.ports[1]))) {
		t.Fatal("the refusal remade node-a")
	}
}

// TestDevReplicaPorts: IDEMKIT_PG_REPLICA_PORTS must be two distinct ports
// 1024-65535; anything else is refused before the script touches anything.
// (Not stop: it also stops Redis, found by its port alone. The ports are
// none of the defaults: a script that took them would start a pair there,
// which the test then kills.)
func TestDevReplicaPorts(t *testing.T) {
	t.Parallel()
	path, err := filepath.Abs("../../../scripts/dev")
	if err != nil {
		t.Fatal(err)
	}
	cred, err := owner()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := makeDir(cred)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for i, ports := range []string{"54397", "54397,54397", "80,54398", "54397,65536", "54397,54398,54399",
		"a,b", "54397;54398", " 54397,54398", "054397,54398", "54397,"} {
		dev := filepath.Join(dir, strconv.Itoa(i))
		for _, cmd := range []string{"replica", "replica-failover", "replica-stop", "status"} {
			c := exec.Command("bash", path, cmd)
			c.Env = append(os.Environ(), "IDEMKIT_DEV_DIR="+dev, "IDEMKIT_PG_REPLICA_PORTS="+ports)
			out, err := c.CombinedOutput()
			if exists(dev) {
				// Whatever it started must not outlive the test.
				pids, _ := filepath.Glob(filepath.Join(dev, "replica", "*", "data", "postmaster.pid"))
				for _, f := range pids {
					data, _ := os.ReadFile(f)
					if pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0])); err == nil {
						_, _ = killTree(syscall.Kill, pid)
					}
				}
				t.Errorf("scripts/dev %s with IDEMKIT_PG_REPLICA_PORTS=%q made %s\n%s", cmd, ports, dev, out)
				continue
			}
			if err == nil || !strings.Contains(string(out), "IDEMKIT_PG_REPLICA_PORTS='"+ports+"'") {
				t.Errorf("scripts/dev %s with IDEMKIT_PG_REPLICA_PORTS=%q: %v, want a refusal naming it\n%s", cmd, ports, err, out)
			}
		}
	}
}
