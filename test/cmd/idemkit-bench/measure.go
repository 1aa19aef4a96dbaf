package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	// Heap allocations of the child (runtime.MemStats: exact, tiny
	// objects counted one by one) and its garbage collections; HeapOK is
	// false for a child not written in Go with this meter (the Watermill
	// peer).
	AllocBytes   uint64 `json:"alloc_bytes"`
	AllocObjects uint64 `json:"alloc_objects"`
	GCCycles     uint64 `json:"gc_cycles"`
	HeapOK       bool   `json:"heap_ok"`
}

type cpuSnapshot struct {
	self, postgres, kafka, machine time.Duration
	postgresOK, kafkaOK, machineOK bool
	allocBytes, allocObjects, gcs  uint64
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
	// ReadMemStats stops the world and flushes the per-P caches: its
	// counts are exact (runtime/metrics counts an allocation only once its
	// cache is flushed, and a tiny block rather than the objects in it).
	// Two calls per child.
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.allocBytes, s.allocObjects, s.gcs = ms.TotalAlloc, ms.Mallocs, uint64(ms.NumGC)
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

		AllocBytes:   s.allocBytes - b.allocBytes,
		AllocObjects: s.allocObjects - b.allocObjects,
		GCCycles:     s.gcs - b.gcs,
		HeapOK:       true,
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
// waiting for messages (from a transaction's commit to the start of the
// next: fetching, or idle under a steady rate); BEGIN and the dedup claim
// (for the runner, from TxStart to the handler); the handler's statements; COMMIT. Unsplit is
// the wait plus BEGIN + claim of transactions whose start was not seen.
type segments struct {
	Wait    time.Duration `json:"wait_ns"`
	Claim   time.Duration `json:"begin_claim_ns"`
	Handle  time.Duration `json:"handler_ns"`
	Commit  time.Duration `json:"commit_ns"`
	Unsplit time.Duration `json:"unsplit_ns"`
}

func (s *segments) add(o segments) {
	s.Wait += o.Wait
	s.Claim += o.Claim
	s.Handle += o.Handle
	s.Commit += o.Commit
	s.Unsplit += o.Unsplit
}

func (s segments) total() time.Duration { return s.Wait + s.Claim + s.Handle + s.Commit + s.Unsplit }

// workerClock follows each partition worker of the runner through its
// transactions, from hooks that run on the partition worker's goroutine:
// TxStart, the handler (its first call in a transaction), BeforeCommit and
// AfterCommit. (A pgx tracer on the pool would see each BEGIN, but it costs
// the runner's child CPU that the PostgreSQL-alone child does not pay.)
//
// The IDFunc is not a clock of the worker: the runner calls it when a message
// is fetched, on the partition's prefetch goroutine, which runs ahead of the
// worker (it fetches the next messages while a transaction runs). Timing the
// worker's "fetch" from it would give negative fetch times whenever messages
// were fetched before the previous commit.
type workerClock struct {
	parts []partClock
}

type partClock struct {
	mu           sync.Mutex
	lastDone     time.Time // the previous AfterCommit
	begun        time.Time // TxStart of the open transaction
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

// txStarted records the TxStart of a transaction. Once an attempt's
// handler ran, later attempts' starts are ignored until the transaction
// commits: a retried transaction counts from its first attempt whose
// handler ran.
func (c *workerClock) txStarted(p int, now time.Time) {
	if pc := c.part(p); pc != nil {
		pc.mu.Lock()
		if pc.handlerStart.IsZero() {
			pc.begun = now
		}
		pc.mu.Unlock()
	}
}

// handlerStarted records the first handler call of a transaction.
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
	prev := pc.lastDone
	pc.lastDone = now
	hs, begun := pc.handlerStart, pc.begun
	pc.handlerStart, pc.begun = time.Time{}, time.Time{}
	if hs.IsZero() || pc.beforeCommit.IsZero() || pc.beforeCommit.Before(hs) {
		return // every message was a duplicate: no handler call to time from
	}
	// The start is valid when it falls between the previous commit and the
	// handler (a stale one belongs to an earlier transaction).
	valid := !begun.IsZero() && !begun.After(hs) && (prev.IsZero() || !begun.Before(prev))
	switch {
	case valid && !prev.IsZero():
		pc.seg.Wait += begun.Sub(prev)
		pc.seg.Claim += hs.Sub(begun)
	case valid: // the partition's first transaction: its wait is the assignment
		pc.seg.Claim += hs.Sub(begun)
	case !prev.IsZero():
		pc.seg.Unsplit += hs.Sub(prev)
	}
	pc.seg.Handle += pc.beforeCommit.Sub(hs)
	pc.seg.Commit += now.Sub(pc.beforeCommit)
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

// walUsage is the WAL a scenario wrote. Scope "own" counts the records of
// the scenario's own transactions (those that touched its schema's tables,
// with their commit records), read with pg_walinspect; scope "cluster" is
// the whole server's WAL meanwhile, other clients' included.
type walUsage struct {
	Bytes         int64   `json:"bytes"`
	Records       int64   `json:"records"`
	BytesPerMsg   float64 `json:"bytes_per_msg"`
	RecordsPerMsg float64 `json:"records_per_msg"`
	Scope         string  `json:"scope"`
}

// walMeter measures WAL around a scenario.
type walMeter struct {
	fn      string // qualified pg_get_wal_records_info; "" without pg_walinspect
	created string // the schema this run created the extension in
}

// setup finds pg_walinspect, or creates it in a schema of this run (dropped
// with the extension at cleanup); without it WAL is measured cluster-wide.
func (w *walMeter) setup(ctx context.Context, admin *pgxpool.Pool, schema string) {
	var ns string
	err := admin.QueryRow(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_walinspect'`).Scan(&ns)
	if errors.Is(err, pgx.ErrNoRows) {
		q := pgx.Identifier{schema}.Sanitize()
		if _, err = admin.Exec(ctx, `CREATE SCHEMA `+q); err == nil {
			w.created = schema
			if _, err = admin.Exec(ctx, `CREATE EXTENSION pg_walinspect SCHEMA `+q); err == nil {
				ns = q
			}
		}
	}
	if err != nil {
		progress("pg_walinspect unavailable (%v): WAL is measured for the whole server", err)
		return
	}
	w.fn = ns + ".pg_get_wal_records_info"
}

func (w *walMeter) scope() string {
	if w.fn == "" {
		return "cluster"
	}
	return "own"
}

func (w *walMeter) cleanup(ctx context.Context, admin *pgxpool.Pool) {
	if w.created != "" {
		if _, err := admin.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{w.created}.Sanitize()+` CASCADE`); err != nil {
			progress("cleanup: drop schema %s: %v", w.created, err)
		}
	}
}

// begin returns the WAL position before a scenario ("" if unknown).
func (w *walMeter) begin(ctx context.Context, admin *pgxpool.Pool) string {
	var lsn string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		progress("WAL position: %v", err)
		return ""
	}
	return lsn
}

// end measures the WAL written since start by the transactions that touched
// schema's tables, per message of n.
func (w *walMeter) end(ctx context.Context, admin *pgxpool.Pool, start, schema string, n int64) *walUsage {
	if start == "" || n <= 0 {
		return nil
	}
	var end string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&end); err != nil {
		progress("WAL position: %v", err)
		return nil
	}
	u := &walUsage{Scope: w.scope()}
	var err error
	if w.fn == "" {
		err = admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::bigint`, start, end).Scan(&u.Bytes)
	} else {
		var nodes string
		err = admin.QueryRow(ctx, `SELECT string_agg(pg_relation_filenode(c.oid)::text, '|')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind IN ('r', 'i', 't')`, schema).Scan(&nodes)
		if err == nil {
			err = admin.QueryRow(ctx, `WITH r AS (
				SELECT xid::text::bigint AS xid, record_length, block_ref FROM `+w.fn+`($1::pg_lsn, $2::pg_lsn)),
			x AS (SELECT DISTINCT xid FROM r WHERE xid <> 0 AND block_ref ~ $3)
			SELECT coalesce(sum(record_length), 0)::bigint, count(*) FROM r WHERE xid IN (SELECT xid FROM x)`,
				start, end, `rel \d+/\d+/(`+nodes+`)\M`).Scan(&u.Bytes, &u.Records)
		}
	}
	if err != nil {
		progress("WAL of %s: %v", schema, err)
		return nil
	}
	u.BytesPerMsg, u.RecordsPerMsg = float64(u.Bytes)/float64(n), float64(u.Records)/float64(n)
	return u
}
