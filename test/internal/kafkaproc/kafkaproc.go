// Package kafkaproc runs a private, single-node Apache Kafka broker (KRaft)
// for one test (Start), or a private three-node cluster (StartCluster):
// formatted in a temporary directory, on free loopback ports, with small
// heaps. The test may stop a node (SIGTERM or SIGKILL) and start it again
// with the same data, to see what clients do while it is gone, and ask a
// cluster which node leads a partition. The shared brokers of scripts/dev
// are never touched.
//
// The broker runs the jars that scripts/dev installs: IDEMKIT_KAFKA_LIBS
// names their folder, else <repository>/.dev/kafka/libs (the repository is
// found by walking up to go.work).
package kafkaproc

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// EnvLibs names the folder of the Kafka jars.
const EnvLibs = "IDEMKIT_KAFKA_LIBS"

// Broker is a private Kafka broker process.
type Broker struct {
	// Addr is the bootstrap address, 127.0.0.1:port.
	Addr string
	// ID is the broker's node.id: 1 for a single broker, 1 to 3 in a
	// Cluster.
	ID int

	dir, libs, props string
	mu               sync.Mutex
	cmd              *exec.Cmd
	exited           chan struct{}
	log              *os.File
}

// Libs returns the folder of the Kafka jars, or an error that says how to get
// them.
func Libs() (string, error) {
	if d := os.Getenv(EnvLibs); d != "" {
		return checkLibs(d)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return checkLibs(filepath.Join(d, ".dev", "kafka", "libs"))
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("kafkaproc: no go.work above %s: set %s to the Kafka jars folder", wd, EnvLibs)
		}
	}
}

func checkLibs(d string) (string, error) {
	m, _ := filepath.Glob(filepath.Join(d, "kafka_*.jar"))
	if len(m) == 0 {
		return "", fmt.Errorf("kafkaproc: no Kafka jars in %s: run scripts/dev start once (it installs them) or set %s", d, EnvLibs)
	}
	return d, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start formats and starts a broker, waits until it answers a metadata
// request, and kills it and removes its files at cleanup. It fails the test
// with a one-line message when the jars or Java are missing.
func Start(tb testing.TB) *Broker {
	tb.Helper()
	libs := mustPrereqs(tb)
	ports := freePorts(tb, 2)
	b := newNode(tb, tb.TempDir(), libs, 1, ports[0], ports[1], fmt.Sprintf("1@127.0.0.1:%d", ports[1]), singleSettings)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.format(ctx, newClusterID(tb)); err != nil {
		tb.Fatal(err)
	}
	b.cleanup(tb)
	if err := b.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	// Which broker a test ran on is part of what it proves.
	tb.Logf("kafkaproc: Kafka %s at %s (%s)", libsVersion(libs), b.Addr, libs)
	return b
}

// libsVersion is the version in the name of libs' kafka-server jar, or
// "unknown".
func libsVersion(libs string) string {
	jars, _ := filepath.Glob(filepath.Join(libs, "kafka-server-[0-9]*.jar"))
	if len(jars) == 0 {
		return "unknown"
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(jars[0]), "kafka-server-"), ".jar")
}

// singleSettings are the settings of a single-node broker: every internal
// topic on one replica.
const singleSettings = `offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
`

// mustPrereqs returns the jars' folder, or fails the test with the fix when
// the jars or Java are missing.
func mustPrereqs(tb testing.TB) string {
	tb.Helper()
	libs, err := Libs()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := exec.LookPath("java"); err != nil {
		tb.Fatal("kafkaproc: java is not installed: run scripts/dev start (Kafka needs Java 17)")
	}
	return libs
}

// freePorts returns n distinct free loopback ports.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ports []int
	for len(ports) < n {
		p, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		if !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	return ports
}

// newClusterID draws a KRaft cluster ID. One that starts with "-" reads as
// an option to the storage tool ("expected one argument"): draw again, as
// Kafka's own Uuid.randomUuid does.
func newClusterID(tb testing.TB) string {
	tb.Helper()
	var clusterID string
	for clusterID == "" || strings.HasPrefix(clusterID, "-") {
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			tb.Fatal(err)
		}
		clusterID = base64.RawURLEncoding.EncodeToString(id[:])
	}
	return clusterID
}

// newNode writes the configuration of KRaft node id (broker and controller)
// in dir: its client port, its controller port, the quorum's voters and
// settings of the caller.
func newNode(tb testing.TB, dir, libs string, id, port, cport int, voters, settings string) *Broker {
	tb.Helper()
	b := &Broker{ID: id, Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir, libs: libs,
		props: filepath.Join(dir, "server.properties")}
	config := fmt.Sprintf(`process.roles=broker,controller
node.id=%[4]d
controller.quorum.voters=%[5]s
listeners=PLAINTEXT://127.0.0.1:%[1]d,CONTROLLER://127.0.0.1:%[2]d
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=%[3]s
num.partitions=1
offsets.topic.num.partitions=3
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
`, port, cport, filepath.Join(dir, "data"), id, voters) + settings
	logCfg := `Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
`
	if err := os.WriteFile(b.props, []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "log4j2.yaml"), []byte(logCfg), 0o644); err != nil {
		tb.Fatal(err)
	}
	return b
}

// format formats the node's storage for the cluster clusterID.
func (b *Broker) format(ctx context.Context, clusterID string) error {
	format := exec.CommandContext(ctx, "java", append(b.jvm(), "kafka.tools.StorageTool", "format",
		"-t", clusterID, "-c", b.props)...)
	if out, err := format.CombinedOutput(); err != nil {
		return fmt.Errorf("kafkaproc: format storage of node %d: %v\n%s", b.ID, err, out)
	}
	return nil
}

// cleanup kills the node at the end of the test.
func (b *Broker) cleanup(tb testing.TB) {
	tb.Cleanup(func() {
		if err := b.Stop(syscall.SIGKILL); err != nil {
			tb.Errorf("kafkaproc: %v", err)
		}
		b.mu.Lock()
		if b.log != nil {
			b.log.Close()
		}
		b.mu.Unlock()
	})
}

func (b *Broker) jvm() []string {
	return []string{"-Xms64m", "-Xmx384m", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(b.dir, "log4j2.yaml"), "-cp", filepath.Join(b.libs, "*")}
}

// Start starts the (stopped) broker on its data and ports and waits until it
// answers a metadata request.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	if b.cmd != nil {
		b.mu.Unlock()
		return errors.New("kafkaproc: broker already running")
	}
	if b.log == nil {
		f, err := os.Create(filepath.Join(b.dir, "kafka.log"))
		if err != nil {
			b.mu.Unlock()
			return err
		}
		b.log = f
	}
	cmd := exec.Command("java", append(b.jvm(), "kafka.Kafka", b.props)...)
	cmd.Stdout, cmd.Stderr = b.log, b.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.mu.Unlock()
		return fmt.Errorf("kafkaproc: start java: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	b.cmd, b.exited = cmd, exited
	b.mu.Unlock()

	// A transport of its own: kafka-go's transports answer metadata
	// requests from the metadata they cached, so a shared one (the default)
	// says "ready" at once when the broker is started again in the same
	// process.
	tr := &kafka.Transport{DialTimeout: time.Second}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(b.Addr), Timeout: 2 * time.Second, Transport: tr}
	for {
		_, err := client.Metadata(ctx, &kafka.MetadataRequest{})
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("kafkaproc: broker exited during start; log: %s", b.LogTail())
		case <-ctx.Done():
			return fmt.Errorf("kafkaproc: broker at %s not ready: %v; log: %s", b.Addr, err, b.LogTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Running reports whether the broker's process was started and not
// stopped by Stop.
func (b *Broker) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd != nil
}

// Stop sends sig (SIGTERM: clean shutdown; SIGKILL: a crash) and waits for
// the process to exit (SIGKILL after 60s). Stopping a stopped broker does
// nothing.
func (b *Broker) Stop(sig syscall.Signal) error {
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal broker: %w", err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	return nil
}

// LogTail returns the last 2 KiB of the broker's log.
func (b *Broker) LogTail() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "kafka.log"))
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return string(data)
}
