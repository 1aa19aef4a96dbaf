// Package pgproc runs a private PostgreSQL server for one test: a cluster
// made by initdb in a temporary folder, listening on a free loopback port
// only, with the server's default durability (fsync and synchronous commit
// on; only initdb skips its final sync). The test may stop the server the way
// `pg_ctl stop -m immediate|fast|smart` does and start it again on the same
// data and port, to see what clients do while it is gone, or kill it with
// SIGKILL (Kill). StartPair starts a primary with a synchronous streaming
// standby for failover tests (replica.go). The shared server of scripts/dev
// is never touched.
//
// The server runs the binaries of Debian's postgresql package: the newest
// /usr/lib/postgresql/*/bin, or the folder IDEMKIT_PG_BIN names. As root, the
// cluster belongs to the postgres user (the server refuses to run as root),
// as in scripts/dev.
//
// The server is a child of the test process, not a daemon that pg_ctl
// detaches: it receives SIGQUIT (an immediate shutdown) when the test process
// dies, so that no cluster outlives a test binary that panicked on -timeout
// (which skips t.Cleanup).
package pgproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvBin names the folder of initdb and postgres, overriding the search under
// /usr/lib/postgresql.
const EnvBin = "IDEMKIT_PG_BIN"

// Mode is how Stop shuts the server down: the modes of pg_ctl stop -m.
type Mode int

const (
	// Immediate kills the server at once (SIGQUIT), like a crash: open
	// transactions vanish, and the next start runs crash recovery. What
	// was committed stays committed.
	Immediate Mode = iota + 1
	// Fast rolls back open transactions, disconnects clients and shuts
	// down cleanly (SIGINT).
	Fast
	// Smart waits for every client to disconnect (SIGTERM).
	Smart
)

func (m Mode) String() string {
	switch m {
	case Immediate:
		return "immediate"
	case Fast:
		return "fast"
	case Smart:
		return "smart"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

func (m Mode) signal() (syscall.Signal, error) {
	switch m {
	case Immediate:
		return syscall.SIGQUIT, nil
	case Fast:
		return syscall.SIGINT, nil
	case Smart:
		return syscall.SIGTERM, nil
	}
	return 0, fmt.Errorf("pgproc: unknown shutdown mode %d", int(m))
}

// Server is a private PostgreSQL server.
type Server struct {
	bin, dir, data string
	port           int
	cred           *syscall.Credential // the postgres user, when running as root
	log            *os.File
	// args are the server settings of this server's role (see replica.go),
	// given to postgres at every start after the common ones.
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd // nil once the postmaster has exited (or never started)
	exited chan struct{}
	// kill sends signals to the server's processes when Kill (or Stop's
	// last resort) kills them: syscall.Kill when nil; tests make it fail.
	kill func(pid int, sig syscall.Signal) error
}

// killWait bounds the waits after a SIGKILL: the postmaster's exit, then its
// backends'.
const killWait = 10 * time.Second

// Bin returns the folder of the PostgreSQL server binaries, or an error that
// says how to get them.
func Bin() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("pgproc: no initdb in %s (%s): point it at a PostgreSQL bin folder", d, EnvBin)
		}
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("pgproc: no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: " +
		"run scripts/dev start once (it installs them) or apt-get install -y postgresql")
}

// version is the major version in /usr/lib/postgresql/<version>/bin.
func version(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}

// Start makes a cluster in a temporary folder, starts its server and waits
// until it accepts connections; at cleanup it stops the server (immediate)
// and removes the folder. It fails the test with a one-line message when the
// binaries, or as root the postgres user, are missing.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return start(tb)
}

// start is Start; args are server settings given at every start.
func start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	s := newServer(tb, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// -N: initdb does not fsync the new cluster; the server itself runs
	// with fsync on.
	initdb := exec.CommandContext(ctx, filepath.Join(s.bin, "initdb"), "-D", s.data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "-N", "--no-instructions")
	s.as(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		tb.Fatalf("pgproc: initdb: %v\n%s", err, out)
	}
	if err := s.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	// Which server a test ran on is part of what it proves.
	ver, _ := exec.CommandContext(ctx, filepath.Join(s.bin, "postgres"), "--version").Output()
	tb.Logf("pgproc: %s on port %d (%s)", strings.TrimSpace(string(ver)), s.port, s.bin)
	return s
}

// newServer makes the folder, the log and the port of a server whose data
// folder is still to be made; at cleanup it stops the server (immediate)
// and removes the folder.
func newServer(tb testing.TB, args ...string) *Server {
	tb.Helper()
	bin, err := Bin()
	if err != nil {
		tb.Fatal(err)
	}
	cred, err := owner()
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := makeDir(cred)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{bin: bin, dir: dir, data: filepath.Join(dir, "data"), cred: cred, args: args}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Stop(ctx, Immediate); err != nil {
			tb.Errorf("pgproc: %v", err)
		}
		if s.log != nil {
			s.log.Close()
		}
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("pgproc: remove %s: %v", dir, err)
		}
	})
	if s.port, err = freePort(); err != nil {
		tb.Fatal(err)
	}
	if s.log, err = os.Create(filepath.Join(dir, "postgres.log")); err != nil {
		tb.Fatal(err)
	}
	return s
}

// owner returns the postgres user's credentials when running as root, nil
// otherwise.
func owner() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("pgproc: running as root needs the postgres user (PostgreSQL refuses to run as root): " +
			"apt-get install -y postgresql creates it")
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgproc: postgres user: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// makeDir makes the cluster's folder, owned by the user the server runs as,
// in the first temporary folder that user can reach.
func makeDir(cred *syscall.Credential) (string, error) {
	bases := []string{os.TempDir()}
	if cred != nil && os.TempDir() != "/var/tmp" {
		bases = append(bases, "/var/tmp")
	}
	for _, base := range bases {
		d, err := os.MkdirTemp(base, "idemkit-pgproc-")
		if err != nil {
			continue
		}
		if cred == nil {
			return d, nil
		}
		if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err == nil {
			test := exec.Command("test", "-w", d)
			test.Dir, test.SysProcAttr = "/", &syscall.SysProcAttr{Credential: cred}
			if test.Run() == nil {
				return d, nil
			}
		}
		os.RemoveAll(d)
	}
	return "", fmt.Errorf("pgproc: the postgres user cannot reach a folder made in %s: set TMPDIR to one it can reach (e.g. /var/tmp)",
		strings.Join(bases, " or "))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// as makes cmd run as the cluster's owner, from a folder that user may
// enter.
func (s *Server) as(cmd *exec.Cmd) {
	cmd.Dir = "/"
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = s.cred
}

// URL returns the connection URL: user postgres, database postgres, no
// password (trust), no TLS.
func (s *Server) URL() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(s.port) + "/postgres?sslmode=disable&connect_timeout=10"
}

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// Start starts the (stopped) server on its data and port and waits until it
// accepts connections; after an immediate stop that includes crash recovery.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("pgproc: server already running")
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "max_connections=100", "-c", "shared_buffers=32MB")
	cmd.Args = append(cmd.Args, s.args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	s.as(cmd)
	// Its own process group (a terminal's ^C goes to the test only); SIGQUIT
	// when the test process dies.
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		// The parent-death signal fires when the thread that started the
		// child exits: keep this goroutine on its thread until the server
		// has exited.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgproc: start postgres: %w", err)
	}
	s.cmd, s.exited = cmd, exited

	for {
		err := ping(ctx, s.URL())
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("pgproc: server exited during start; log: %s", s.LogTail())
		case <-ctx.Done():
			return fmt.Errorf("pgproc: server on port %d not ready: %v; log: %s", s.port, err, s.LogTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// Stop shuts the server down in the given mode, as pg_ctl stop -m does (the
// same signal to the postmaster), and waits until it and its backends have
// exited. When ctx ends first, the server is killed (SIGKILL), as by Kill;
// when that fails too, the error names the postmaster's pid and the server
// stays this Server's, for a later Stop or Kill. Stopping a stopped server
// does nothing.
func (s *Server) Stop(ctx context.Context, mode Mode) error {
	sig, err := mode.signal()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, exited := s.cmd, s.exited
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgproc: signal the server (postmaster %d): %w", cmd.Process.Pid, err)
	}
	select {
	case <-exited:
		s.cmd = nil
		return nil
	case <-ctx.Done():
	}
	if err := s.killLocked(); err != nil {
		return fmt.Errorf("pgproc: %s shutdown did not finish (%v), and killing the server failed: %w", mode, ctx.Err(), err)
	}
	return fmt.Errorf("pgproc: %s shutdown did not finish (%v); killed the server", mode, ctx.Err())
}

// Kill kills the server and every backend with SIGKILL, like a machine
// that loses its power: no shutdown, no last WAL sent to a standby, clients
// left with connections that were reset. It waits until the processes have
// exited. Killing a stopped server does nothing. When a signal cannot be
// sent, or the postmaster has not exited 10 s after SIGKILL, the error names
// its pid and the server stays this Server's (the test's cleanup stops it).
//
// Killing the postmaster alone is not that: each backend leads a process
// group of its own (PostgreSQL calls setsid), survives the postmaster for a
// moment and ends its session with 57P01 "terminating connection due to
// unexpected postmaster exit". So the postmaster is stopped (SIGSTOP: it
// forks no more), its children are listed, and all are killed.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.killLocked()
}

// killLocked kills the running server (s.mu held) and waits, within
// killWait each, until the postmaster and then its children have exited.
// s.cmd is cleared once the postmaster has exited, not before: a server
// that could not be killed is still there to stop.
func (s *Server) killLocked() error {
	cmd, exited := s.cmd, s.exited
	pid := cmd.Process.Pid
	kill := s.kill
	if kill == nil {
		kill = syscall.Kill
	}
	kids, err := killTree(kill, pid)
	if err != nil {
		return err
	}
	select {
	case <-exited:
		s.cmd = nil
	case <-time.After(killWait):
		return fmt.Errorf("pgproc: postmaster %d has not exited %v after SIGKILL", pid, killWait)
	}
	// The children are init's now: wait until none runs (gone, or a zombie
	// whose sockets are closed).
	for deadline := time.Now().Add(killWait); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		alive := 0
		for _, p := range kids {
			if st, _, ok := procStat(p); ok && st != 'Z' {
				alive++
			}
		}
		if alive == 0 {
			return nil
		}
	}
	return fmt.Errorf("pgproc: processes of the killed server (postmaster %d) still run %v after SIGKILL", pid, killWait)
}

// killTree stops the postmaster pid (SIGSTOP: it forks no more), then kills
// it and each of its children with SIGKILL, by kill (syscall.Kill); it
// returns the children. Its errors name the process.
func killTree(kill func(int, syscall.Signal) error, pid int) ([]int, error) {
	if err := kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, fmt.Errorf("pgproc: stop the postmaster %d: %w", pid, err)
	}
	kids := children(pid)
	for _, p := range append(kids, pid) {
		if err := kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return kids, fmt.Errorf("pgproc: kill process %d of the server (postmaster %d): %w", p, pid, err)
		}
	}
	return kids, nil
}

// children returns the processes whose parent is pid.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(p); ok && ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// procStat returns the state and the parent of process pid, from
// /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces and
// parentheses).
func procStat(pid int) (state byte, ppid int, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err == nil
}

// Restart stops the server in the given mode and starts it again, as
// pg_ctl restart -m does, and waits until it accepts connections.
func (s *Server) Restart(ctx context.Context, mode Mode) error {
	if err := s.Stop(ctx, mode); err != nil {
		return err
	}
	return s.Start(ctx)
}

// LogTail returns the last 2 KiB of the server's log.
func (s *Server) LogTail() string {
	data, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return string(data)
}
