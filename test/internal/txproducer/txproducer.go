// Package txproducer writes to Kafka with Kafka's own Java producer in
// transactional mode (transactional.id, enable.idempotence), as Kafka
// Streams, Debezium or any Java service with exactly-once settings do, so
// that tests can put committed, aborted, interleaved and open transactions
// (and their markers) in a topic. kafka-go has no transactional producer.
//
// One JVM per Process runs TxProducer.java (compiled once per machine with
// javac into the temporary directory) and takes commands from the test over
// stdin, so a transaction stays open for exactly as long as the test wants.
// The jars are the ones scripts/dev installs (see kafkaproc.Libs).
package txproducer

import (
	"bufio"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/test/internal/kafkaproc"
)

//go:embed TxProducer.java
var source []byte

// Timeout bounds one command: initialising a transactional producer waits
// for the transaction coordinator, which may still be loading.
const Timeout = 2 * time.Minute

// Compression is a Java producer's compression.type.
type Compression string

// The compression types of the Java producer.
const (
	None   Compression = "none"
	Gzip   Compression = "gzip"
	Snappy Compression = "snappy"
	Lz4    Compression = "lz4"
	Zstd   Compression = "zstd"
)

// Process is one JVM running the transactional producers of a test. Its
// methods must be called from the test's goroutine (they fail the test).
type Process struct {
	tb     testing.TB
	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string   // answers; closed when stdout ends
	read   chan struct{} // closed when the stdout reader returned
	stderr *lockedBuffer
	names  int
}

// Start runs a JVM that produces to bootstrap and stops it at cleanup. It
// fails the test with a one-line fix when Java or the Kafka jars are
// missing.
func Start(tb testing.TB, bootstrap string) *Process {
	tb.Helper()
	libs, err := kafkaproc.Libs()
	if err != nil {
		tb.Fatal(err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		tb.Fatal("txproducer: java is not installed: run `apt-get install -y openjdk-17-jdk-headless` (Java 17 with javac)")
	}
	classes, err := compile(libs)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp",
		classes+string(os.PathListSeparator)+filepath.Join(libs, "*"), "TxProducer", bootstrap)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := &Process{tb: tb, cmd: cmd, stdin: stdin, lines: make(chan string), read: make(chan struct{}),
		stderr: &lockedBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("txproducer: start java: %v", err)
	}
	go func() {
		defer close(p.read)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	tb.Cleanup(p.stop)
	if _, err := p.answer(); err != nil {
		tb.Fatalf("txproducer: the JVM did not start: %v", err)
	}
	return p
}

// compile compiles TxProducer.java once per machine (per source version)
// into the temporary directory and returns the classes' folder.
func compile(libs string) (string, error) {
	sum := sha256.Sum256(source)
	dir := filepath.Join(os.TempDir(), "idemkit-txproducer-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "TxProducer.class")); err == nil {
		return dir, nil
	}
	javac, err := exec.LookPath("javac")
	if err != nil {
		return "", errors.New("txproducer: javac is not installed: run `apt-get install -y openjdk-17-jdk-headless`")
	}
	tmp, err := os.MkdirTemp(os.TempDir(), "idemkit-txproducer-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "TxProducer.java")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(tmp, "classes")
	if b, err := exec.Command(javac, "-nowarn", "-cp", filepath.Join(libs, "*"), "-d", out, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("txproducer: javac TxProducer.java: %v\n%s", err, b)
	}
	// Another test binary may have won the race: its classes are the same.
	if err := os.Rename(out, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "TxProducer.class")); serr != nil {
			return "", fmt.Errorf("txproducer: %w", err)
		}
	}
	return dir, nil
}

// answer waits for the JVM's next line.
func (p *Process) answer() (string, error) {
	t := time.NewTimer(Timeout)
	defer t.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			return "", fmt.Errorf("the JVM exited; its stderr:\n%s", p.stderr.String())
		}
		if rest, ok := strings.CutPrefix(line, "ok"); ok {
			return strings.TrimSpace(rest), nil
		}
		return "", fmt.Errorf("%s\nthe JVM's stderr:\n%s", line, p.stderr.String())
	case <-t.C:
		return "", fmt.Errorf("no answer after %s; the JVM's stderr:\n%s", Timeout, p.stderr.String())
	}
}

// do sends one command and returns the data of its "ok" answer.
func (p *Process) do(fields ...string) string {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	line := strings.Join(fields, " ")
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.tb.Fatalf("txproducer: %s: %v; the JVM's stderr:\n%s", fields[0], err, p.stderr.String())
	}
	out, err := p.answer()
	if err != nil {
		p.tb.Fatalf("txproducer: %s: %v", line, err)
	}
	return out
}

// stop asks the JVM to close its producers and exit, kills it if it does
// not, and waits for it and the stdout reader.
func (p *Process) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = io.WriteString(p.stdin, "quit\n")
	_ = p.stdin.Close()
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	for drained := false; !drained; {
		select {
		case _, ok := <-p.lines:
			drained = !ok
		case <-t.C:
			_ = p.cmd.Process.Kill()
			for range p.lines {
			}
			drained = true
		}
	}
	<-p.read
	_ = p.cmd.Wait()
}

// Producer creates a transactional producer with transactional.id id (made
// unique to the test when empty) and the given compression, and runs
// initTransactions: a transaction the same id left open is aborted (or, if
// its commit had begun, committed) by the broker first.
func (p *Process) Producer(id string, compression Compression) *Producer {
	p.tb.Helper()
	p.names++
	name := "p" + strconv.Itoa(p.names)
	if id == "" {
		id = strings.NewReplacer("/", "_", " ", "_").Replace(p.tb.Name()) + "-" + name + "-" +
			strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	if compression == "" {
		compression = None
	}
	p.do("producer", name, id, string(compression))
	return &Producer{p: p, name: name, ID: id}
}

// Producer is one transactional producer of a Process.
type Producer struct {
	p    *Process
	name string
	// ID is the producer's transactional.id.
	ID string
}

// Begin begins a transaction. It stays open (hangs, holding every
// read_committed reader of its partitions at its first offset) until Commit
// or Abort, or until the broker aborts it after transaction.timeout.ms (set
// to five minutes).
func (pr *Producer) Begin() {
	pr.p.tb.Helper()
	pr.p.do("begin", pr.name)
}

// Send queues a record for topic's partition with a "message-id" header id
// (none when id is empty); a nil key or value is sent as null. Nothing goes
// to the broker before Flush, Commit or Abort, and what is queued for one
// partition goes out as one record batch.
func (pr *Producer) Send(topic string, partition int, key, value []byte, id string) {
	pr.p.tb.Helper()
	var h []kafka.Header
	if id != "" {
		h = []kafka.Header{{Key: "message-id", Value: []byte(id)}}
	}
	pr.SendHeaders(topic, partition, key, value, h)
}

// SendHeaders queues a record as Send does, with these headers (in this
// order) and no other: for example a dead letter's, as dlq.Writer wrote it.
func (pr *Producer) SendHeaders(topic string, partition int, key, value []byte, headers []kafka.Header) {
	pr.p.tb.Helper()
	enc := func(b []byte) string {
		if b == nil {
			return "-"
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	fields := []string{"send", pr.name, topic, strconv.Itoa(partition), enc(key), enc(value), "-"}
	for _, h := range headers {
		fields = append(fields, enc([]byte(h.Key)), enc(h.Value))
	}
	pr.p.do(fields...)
}

// Flush sends the queued records and returns their offsets, in the order
// they were queued.
func (pr *Producer) Flush() []int64 {
	pr.p.tb.Helper()
	return pr.offsets(pr.p.do("flush", pr.name))
}

// Commit flushes and commits the transaction; it returns the offsets of the
// records it flushed.
func (pr *Producer) Commit() []int64 {
	pr.p.tb.Helper()
	return pr.offsets(pr.p.do("commit", pr.name))
}

// Abort flushes and aborts the transaction (the flushed records stay in the
// log, followed by an abort marker); it returns the offsets of the records
// it flushed.
func (pr *Producer) Abort() []int64 {
	pr.p.tb.Helper()
	return pr.offsets(pr.p.do("abort", pr.name))
}

// Close closes the producer; a transaction it left open stays open until
// the broker times it out or another producer with the same ID starts.
func (pr *Producer) Close() {
	pr.p.tb.Helper()
	pr.p.do("close", pr.name)
}

func (pr *Producer) offsets(s string) []int64 {
	pr.p.tb.Helper()
	var out []int64
	for _, f := range strings.Fields(s) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			pr.p.tb.Fatalf("txproducer: offset %q: %v", f, err)
		}
		out = append(out, n)
	}
	return out
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(s []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(s)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
