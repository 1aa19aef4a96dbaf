package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of /proc CPU times (100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuUsage is CPU time spent during a scenario's measured interval, in
// seconds: by the child process itself, by its PostgreSQL backends, by the
// Kafka broker (which other clients may share), and by the whole machine.
// A zero field with its ok flag false could not be read (not Linux, or the
// server runs elsewhere).
type cpuUsage struct {
	Self        float64 `json:"self_s"`
	Postgres    float64 `json:"postgres_backends_s"`
	PostgresOK  bool    `json:"postgres_ok"`
	Kafka       float64 `json:"kafka_broker_s"`
	KafkaOK     bool    `json:"kafka_ok"`
	MachineBusy float64 `json:"machine_busy_s"`
	MachineOK   bool    `json:"machine_ok"`
}

type cpuSnapshot struct {
	self, postgres, kafka, machine time.Duration
	postgresOK, kafkaOK, machineOK bool
}

// cpuMeter takes a snapshot at the start and at the end of the measured
// interval.
type cpuMeter struct {
	backends []int // PostgreSQL backend PIDs of the child's pool
	kafkaPID int

	mu    sync.Mutex
	start cpuSnapshot
	usage cpuUsage
}

func (m *cpuMeter) snapshot() cpuSnapshot {
	var s cpuSnapshot
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.postgresOK = len(m.backends) > 0
	for _, pid := range m.backends {
		d, ok := processCPU(pid)
		s.postgres += d
		s.postgresOK = s.postgresOK && ok
	}
	if m.kafkaPID > 0 {
		s.kafka, s.kafkaOK = processCPU(m.kafkaPID)
	}
	s.machine, s.machineOK = machineBusy()
	return s
}

func (m *cpuMeter) begin() {
	s := m.snapshot()
	m.mu.Lock()
	m.start = s
	m.mu.Unlock()
}

func (m *cpuMeter) end() {
	s := m.snapshot()
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.start
	m.usage = cpuUsage{
		Self:        (s.self - b.self).Seconds(),
		Postgres:    (s.postgres - b.postgres).Seconds(),
		PostgresOK:  s.postgresOK && b.postgresOK,
		Kafka:       (s.kafka - b.kafka).Seconds(),
		KafkaOK:     s.kafkaOK && b.kafkaOK,
		MachineBusy: (s.machine - b.machine).Seconds(),
		MachineOK:   s.machineOK && b.machineOK,
	}
}

func (m *cpuMeter) result() cpuUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usage
}

// processCPU reads utime+stime of a process from /proc/PID/stat.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces: count fields after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * clockTick, true
}

// machineBusy reads the CPU time all CPUs spent not idle from /proc/stat.
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest times are already in user
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		busy += n
	}
	return time.Duration(busy) * clockTick, true
}

// findKafkaPID looks for a local Kafka broker process (its JVM runs the main
// class kafka.Kafka). It returns 0 when there is none on this machine.
func findKafkaPID() int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(cmd, []byte{0}) {
			if string(arg) == "kafka.Kafka" {
				pid, _ := strconv.Atoi(filepath.Base(d))
				return pid
			}
		}
	}
	return 0
}

// segments split the time of the partition workers (summed over workers):
// waiting for and fetching messages; lingering for a batch to fill, BEGIN and
// the dedup claim; the handler's statements; COMMIT.
type segments struct {
	Fetch  time.Duration `json:"fetch_ns"`
	Claim  time.Duration `json:"begin_claim_ns"`
	Handle time.Duration `json:"handler_ns"`
	Commit time.Duration `json:"commit_ns"`
}

func (s *segments) add(o segments) {
	s.Fetch += o.Fetch
	s.Claim += o.Claim
	s.Handle += o.Handle
	s.Commit += o.Commit
}

func (s segments) total() time.Duration { return s.Fetch + s.Claim + s.Handle + s.Commit }

// workerClock follows each partition worker of the runner through its
// transactions, from the runner's hooks: IDFunc (a message was fetched), the
// handler (its first call in a transaction), BeforeCommit and AfterCommit.
// All of them run on the partition's goroutine.
type workerClock struct {
	parts []partClock
}

type partClock struct {
	mu           sync.Mutex
	lastDone     time.Time // the previous AfterCommit, or the first fetch
	lastFetch    time.Time
	handlerStart time.Time
	beforeCommit time.Time
	seg          segments
	txs, msgs    int64
}

func newWorkerClock(partitions int) *workerClock {
	return &workerClock{parts: make([]partClock, partitions)}
}

func (c *workerClock) part(p int) *partClock {
	if p < 0 || p >= len(c.parts) {
		return nil
	}
	return &c.parts[p]
}

func (c *workerClock) fetched(p int, now time.Time) {
	if pc := c.part(p); pc != nil {
		pc.mu.Lock()
		pc.lastFetch = now
		if pc.lastDone.IsZero() {
			pc.lastDone = now
		}
		pc.mu.Unlock()
	}
}

func (c *workerClock) handlerStarted(p int, now time.Time) {
	if pc := c.part(p); pc != nil {
		pc.mu.Lock()
		if pc.handlerStart.IsZero() {
			pc.handlerStart = now
		}
		pc.mu.Unlock()
	}
}

func (c *workerClock) beforeCommit(p int, now time.Time) {
	if pc := c.part(p); pc != nil {
		pc.mu.Lock()
		pc.beforeCommit = now
		pc.mu.Unlock()
	}
}

func (c *workerClock) afterCommit(p, n int, now time.Time) {
	pc := c.part(p)
	if pc == nil {
		return
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.lastFetch.IsZero() || pc.beforeCommit.IsZero() {
		return
	}
	pc.seg.Fetch += pc.lastFetch.Sub(pc.lastDone)
	if pc.handlerStart.IsZero() { // every message was a duplicate
		pc.seg.Claim += pc.beforeCommit.Sub(pc.lastFetch)
	} else {
		pc.seg.Claim += pc.handlerStart.Sub(pc.lastFetch)
		pc.seg.Handle += pc.beforeCommit.Sub(pc.handlerStart)
	}
	pc.seg.Commit += now.Sub(pc.beforeCommit)
	pc.lastDone, pc.handlerStart = now, time.Time{}
	pc.txs++
	pc.msgs += int64(n)
}

// record adds one transaction timed directly (PostgreSQL alone).
func (c *workerClock) record(p, n int, seg segments) {
	if pc := c.part(p); pc != nil {
		pc.mu.Lock()
		pc.seg.add(seg)
		pc.txs++
		pc.msgs += int64(n)
		pc.mu.Unlock()
	}
}

func (c *workerClock) sum() (seg segments, txs, msgs int64) {
	for i := range c.parts {
		pc := &c.parts[i]
		pc.mu.Lock()
		seg.add(pc.seg)
		txs += pc.txs
		msgs += pc.msgs
		pc.mu.Unlock()
	}
	return seg, txs, msgs
}
