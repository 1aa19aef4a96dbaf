package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idemkit/consumer"
)

// The benchmark's targets: throughput as ratios of scenarios measured in one
// run, latency at a steady rate, and the consumer's memory.
const (
	targetBatchedVsPerMessage      = 8.0  // batched + per-message handler ≥ 8× per-message transactions
	targetBatchHandlerVsPerMessage = 25.0 // batched + batch handler ≥ 25× per-message transactions
	targetBatchHandlerVsPG         = 0.80 // batched + batch handler ≥ 80% of PostgreSQL alone, same SQL and batching
	targetPeakRSSMiB               = 64.0 // consumer peak RSS ≤ 64 MiB

	targetDefaultVsWatermill    = 5.0  // default settings ≥ 5× the Watermill peer
	targetPerMessageVsPG        = 0.85 // one transaction per message ≥ 85% of PostgreSQL alone, same statements
	targetPerMessageVsWatermill = 0.9  // one transaction per message ≥ 0.9× the Watermill peer
	targetSteadyP99Ms           = 50.0 // produce→commit p99 < 50 ms at a steady 2,000 msgs/s, every mode
	targetSteadyRate            = 2000
)

type report struct {
	o       *options
	brokers []string

	pgVersion, pgFsync, pgSyncCommit, pgSharedBuffers string
	kafkaLocal                                        bool
	backlogSeconds                                    float64
	walScope                                          string

	results []*result // throughput scenarios, each its median round
	steady  []*result // steady-rate runs, in run order
	scale   []*scaleResult
}

func (r *report) find(name string) *result {
	for _, x := range r.results {
		if x.Scenario == name {
			return x
		}
	}
	return nil
}

// roundRatios returns the lowest, median and highest ratio of a's rounds
// to b's, round i to round i: the two ran next to each other in each round,
// so the ratios show how much of a difference between the medians is the
// machine's drift; ok is false without at least two rounds each.
func roundRatios(a, b []float64) (lo, med, hi float64, ok bool) {
	n := min(len(a), len(b))
	if n < 2 {
		return 0, 0, 0, false
	}
	rs := make([]float64, 0, n)
	for i := range n {
		if b[i] <= 0 {
			return 0, 0, 0, false
		}
		rs = append(rs, a[i]/b[i])
	}
	slices.Sort(rs)
	med = rs[n/2]
	if n%2 == 0 {
		med = (rs[n/2-1] + rs[n/2]) / 2
	}
	return rs[0], med, rs[n-1], true
}

// target is one checked target of the benchmark.
type target struct {
	Name     string  `json:"name"`
	Want     string  `json:"want"`
	Got      string  `json:"got"`
	Value    float64 `json:"value"`
	Measured bool    `json:"measured"`
	Pass     bool    `json:"pass"`
}

func (r *report) targets() []target {
	ratio := func(name, want, a, b string, min float64, pct bool) target {
		t := target{Name: name, Want: want}
		x, y := r.find(a), r.find(b)
		if x == nil || y == nil || y.Rate == 0 {
			t.Got = fmt.Sprintf("n/a (needs -scenarios %s,%s)", a, b)
			return t
		}
		t.Value, t.Measured = x.Rate/y.Rate, true
		t.Pass = t.Value >= min
		if pct {
			t.Got = fmt.Sprintf("%.1f%% (%.0f / %.0f msgs/s)", 100*t.Value, x.Rate, y.Rate)
		} else {
			t.Got = fmt.Sprintf("%.1f× (%.0f / %.0f msgs/s)", t.Value, x.Rate, y.Rate)
		}
		if lo, med, hi, ok := roundRatios(x.Rounds, y.Rounds); ok {
			if pct {
				t.Got += fmt.Sprintf("; round by round %.0f–%.0f%%, median %.1f%%", 100*lo, 100*hi, 100*med)
			} else {
				t.Got += fmt.Sprintf("; round by round %.2f–%.2f×, median %.2f×", lo, hi, med)
			}
		}
		return t
	}
	out := []target{
		ratio("default settings vs the Watermill peer", "≥ 5×",
			"default", "watermill", targetDefaultVsWatermill, false),
		ratio("batched + per-message handler vs per-message transactions", "≥ 8×",
			"batched", "per-message", targetBatchedVsPerMessage, false),
		ratio("batched + batch handler vs per-message transactions", "≥ 25×",
			"batch-handler", "per-message", targetBatchHandlerVsPerMessage, false),
		ratio("batched + batch handler vs PostgreSQL alone, same SQL and batching", "≥ 80%",
			"batch-handler", "pg-batched", targetBatchHandlerVsPG, true),
		ratio("BatchSize 1 vs PostgreSQL alone doing the same statements", "≥ 85%",
			"per-message", "pg-per-message", targetPerMessageVsPG, true),
		ratio("BatchSize 1 vs the Watermill peer", "≥ 0.9×",
			"per-message", "watermill", targetPerMessageVsWatermill, false),
	}
	for _, x := range r.steady {
		if x.Steady == nil || x.Steady.TargetRate != targetSteadyRate {
			continue
		}
		sc := findScenario(x.Scenario)
		s := x.Steady
		t := target{Name: fmt.Sprintf("produce→commit p99 at a steady %d msgs/s: %s", targetSteadyRate, sc.title),
			Want: fmt.Sprintf("< %.0f ms", targetSteadyP99Ms), Value: s.P99Ms, Measured: true,
			Pass: s.P99Ms < targetSteadyP99Ms && s.KeptUp}
		t.Got = fmt.Sprintf("%.1f ms", s.P99Ms)
		if !s.KeptUp {
			t.Got += " (did not keep up)"
		}
		out = append(out, t)
	}
	rss := target{Name: "consumer peak RSS (largest of the consumer runs)", Want: "≤ 64 MiB",
		Got: "n/a (no consumer scenario ran)"}
	var worst *result
	for _, x := range r.results {
		if s := findScenario(x.Scenario); s.kind == kindConsumer && (worst == nil || x.PeakRSSMiB > worst.PeakRSSMiB) {
			worst = x
		}
	}
	if worst != nil {
		rss.Value, rss.Measured = worst.PeakRSSMiB, true
		rss.Pass = worst.PeakRSSMiB <= targetPeakRSSMiB
		rss.Got = fmt.Sprintf("%.1f MiB (%s)", worst.PeakRSSMiB, worst.Scenario)
	}
	return append(out, rss)
}

func (r *report) print(w io.Writer) {
	o := r.o
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("\n## idemkit-bench, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	p("- %s %s/%s, GOMAXPROCS=%d, %d CPUs\n", runtime.Version(), runtime.GOOS, runtime.GOARCH,
		runtime.GOMAXPROCS(0), runtime.NumCPU())
	p("- %s; fsync=%s, synchronous_commit=%s, shared_buffers=%s\n", r.pgVersion, r.pgFsync, r.pgSyncCommit,
		r.pgSharedBuffers)
	local := "remote"
	if r.kafkaLocal {
		local = "on this machine"
	}
	p("- Kafka at %s (%s); topics of %d partitions, replication 1, produced with acks=all\n",
		strings.Join(r.brokers, ","), local, o.partitions)
	p("- %d messages over %d accounts; batches of up to %d (BatchLinger %s); each process has a pool of %d connections; PostgreSQL alone runs %d workers\n",
		o.messages, o.accounts, o.batch, consumer.BatchLingerDefault, o.partitions, o.partitions)
	if r.backlogSeconds > 0 {
		p("- backlog produced in %.1fs (%.0f msgs/s)\n", r.backlogSeconds, float64(o.messages)/r.backlogSeconds)
	}

	p("- WAL per message: %s\n", map[string]string{
		"own":     "the records of the scenario's own transactions (pg_walinspect: every record of a transaction that touched its schema, commit records included), after a CHECKPOINT",
		"cluster": "the whole server's WAL during the scenario (pg_walinspect unavailable), other clients' included",
		"":        "not measured"}[r.walScope])
	p("- Watermill peer (test/peers/watermill): Watermill v1.5.1 router (Recoverer middleware), watermill-kafka v3.0.6 " +
		"subscriber (IBM/sarama v1.43.3, protocol V3_6_0_0, oldest offset for a new group, offsets marked on ack and " +
		"auto-committed every 1s), one pgx transaction per message: claim (INSERT … ON CONFLICT DO NOTHING, no position) + upsert\n")

	if len(r.results) > 0 {
		wm := r.find("watermill")
		p("\n| scenario | msgs/s (median) | rounds | × per-message | × Watermill peer | %% of PG-alone, same SQL | client CPU-s / 100k msgs | PG backends CPU-s / 100k msgs | peak RSS MiB | client heap allocs / msg: B (objects) | WAL B / msg | WAL records / msg | msgs/tx | CPU cores: client / PG backends / Kafka / machine |\n")
		p("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
		for _, x := range r.results {
			sc := findScenario(x.Scenario)
			times, pct, vsWM := "", "", ""
			if base := r.find(sc.base); base != nil && base.Rate > 0 {
				times = fmt.Sprintf("%.2f×", x.Rate/base.Rate)
			}
			if wm != nil && wm.Rate > 0 {
				vsWM = fmt.Sprintf("%.2f×", x.Rate/wm.Rate)
			}
			if pg := r.find(sc.pgAlone); pg != nil && pg.Rate > 0 {
				pct = fmt.Sprintf("%.0f%%", 100*x.Rate/pg.Rate)
			}
			rounds := make([]string, len(x.Rounds))
			for i, v := range x.Rounds {
				rounds[i] = fmt.Sprintf("%.0f", v)
			}
			per100k := func(v float64, ok bool) string {
				if !ok || x.Messages == 0 {
					return "?"
				}
				return fmt.Sprintf("%.2f", v*1e5/float64(x.Messages))
			}
			walB, walR := "?", "?"
			if x.WAL != nil {
				walB = fmt.Sprintf("%.0f", x.WAL.BytesPerMsg)
				if x.WAL.Scope == "own" {
					walR = fmt.Sprintf("%.1f", x.WAL.RecordsPerMsg)
				}
			}
			allocs := "?"
			if x.CPU.HeapOK && x.Messages > 0 {
				allocs = fmt.Sprintf("%.0f (%.1f)", float64(x.CPU.AllocBytes)/float64(x.Messages),
					float64(x.CPU.AllocObjects)/float64(x.Messages))
			}
			p("| %s (`%s`) | %.0f | %s | %s | %s | %s | %s | %s | %.1f | %s | %s | %s | %.1f | %s |\n", sc.title, sc.name, x.Rate,
				strings.Join(rounds, " / "), times, vsWM, pct, per100k(x.CPU.Self, true),
				per100k(x.CPU.Postgres, x.CPU.PostgresOK), x.PeakRSSMiB, allocs, walB, walR,
				float64(x.Messages)/float64(max(x.Txs, 1)), cores(x))
		}
		p("\n× per-message: against `per-message` for consumer rows and the peer, against `pg-per-message` for PG-alone rows. " +
			"%% of PG-alone: against the PostgreSQL-alone run of the same SQL and batching " +
			"(`per-message`→`pg-per-message`, `default` and `batched`→`pg-batched-each`, `batch-handler`→`pg-batched`, " +
			"`watermill`→`pg-minimal`). CPU-s / 100k msgs: user+sys CPU of the child process (getrusage) and of its " +
			"PostgreSQL backends (/proc) during the measured interval, per 100,000 messages. Peak RSS: the child's " +
			"(rusage), the largest of its rounds. Heap allocs: bytes and objects the child's Go heap allocated " +
			"during the measured interval (runtime.MemStats), per message; ? for the Watermill peer. The interval " +
			"starts at the first fetched message, so each partition's first fetch is decoded before it. CPU cores: CPU-seconds per second of the measured interval; " +
			"Kafka and machine include whatever else runs on them.\n")

		p("\nWhere the partition workers' time goes (ms per transaction, share of worker time):\n\n")
		unsplit := false
		for _, x := range r.results {
			unsplit = unsplit || x.Segments.Unsplit > 0
		}
		if unsplit {
			p("| scenario | wait for messages | BEGIN + claim | handler | COMMIT | wait + BEGIN + claim, unsplit |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
		} else {
			p("| scenario | wait for messages | BEGIN + claim | handler | COMMIT |\n| --- | ---: | ---: | ---: | ---: |\n")
		}
		for _, x := range r.results {
			s, total := x.Segments, x.Segments.total()
			if total <= 0 || x.Txs == 0 {
				continue
			}
			cell := func(d time.Duration) string {
				return fmt.Sprintf("%.2f (%.0f%%)", ms(d)/float64(x.Txs), 100*float64(d)/float64(total))
			}
			wait := cell(s.Wait)
			if findScenario(x.Scenario).kind == kindPG {
				wait = "—"
			}
			p("| `%s` | %s | %s | %s | %s |", x.Scenario, wait, cell(s.Claim), cell(s.Handle), cell(s.Commit))
			if unsplit {
				p(" %s |", cell(s.Unsplit))
			}
			p("\n")
		}
		p("\nWait for messages: from a transaction's commit to the start of the next on the same partition worker " +
			"(fetching, the runner's own work between transactions, or the broker being behind). A transaction starts " +
			"at TxStart (idemkit's observer) or at the BEGIN timed in the handler (the " +
			"Watermill peer, whose \"wait\" also holds its ack and the router's dispatch; its \"handler\" is the upsert). " +
			"PostgreSQL-alone workers never wait.\n")
	}

	if each := r.find("pg-batched-each"); each != nil {
		for _, v := range []struct{ name, how string }{
			{"pg-batched-savepoint", "SAVEPOINT and RELEASE around each upsert (3 round trips a message)"},
			{"pg-batched-savepoint-merged", "each RELEASE sent with the next SAVEPOINT (2 round trips a message)"},
		} {
			if sp := r.find(v.name); sp != nil {
				p("\nSavepoint per message (`%s`; PostgreSQL alone, batched claim + one upsert per message, "+
					"batches of %d), %s: %.0f msgs/s vs %.0f without savepoints: %.2f× (%+.0f%%).\n",
					v.name, o.batch, v.how, sp.Rate, each.Rate, sp.Rate/each.Rate, 100*(sp.Rate/each.Rate-1))
			}
		}
	}
	r.printSteady(p)
	r.printScale(p)
	if len(r.results) == 0 && len(r.steady) == 0 {
		return // a scaling run alone measures none of the targets below
	}

	p("\nTargets:\n\n| target | wanted | measured | |\n| --- | --- | --- | --- |\n")
	for _, t := range r.targets() {
		verdict := "—"
		if t.Measured {
			verdict = "MISS"
			if t.Pass {
				verdict = "PASS"
			}
		}
		p("| %s | %s | %s | %s |\n", t.Name, t.Want, t.Got, verdict)
	}
	for _, x := range r.results {
		if x.Duplicates > 0 {
			p("\nNote: `%s` saw %d duplicates (a redelivery, e.g. after a rebalance); its result was still verified.\n",
				x.Scenario, x.Duplicates)
		}
	}
}

// printSteady prints the steady-rate latency tables: one line per mode,
// p50 / p99 at each rate, then the details of every run.
func (r *report) printSteady(p func(format string, args ...any)) {
	if len(r.steady) == 0 {
		return
	}
	var modes []string
	var rates []int
	cell := map[string]map[int]*result{}
	for _, x := range r.steady {
		if x.Steady == nil {
			continue
		}
		if cell[x.Scenario] == nil {
			cell[x.Scenario] = map[int]*result{}
			modes = append(modes, x.Scenario)
		}
		if !slices.Contains(rates, x.Steady.TargetRate) {
			rates = append(rates, x.Steady.TargetRate)
		}
		cell[x.Scenario][x.Steady.TargetRate] = x
	}
	p("\nSteady rates, %s each: produce→commit latency p50 / p99 in ms (produce time stamped by the producer "+
		"before its write, commit time taken right after the effect's transaction committed: AfterCommit for idemkit, "+
		"after tx.Commit in the Watermill peer's handler; produce→fetch is taken in idemkit's IDFunc, called as the "+
		"message is fetched, and at the Watermill handler's entry); \"behind\" marks a run whose last effect committed more than %s "+
		"after the last produce returned.\n\n", r.o.steady, steadyKeptUp)
	p("| mode |")
	for _, rate := range rates {
		p(" %d msgs/s |", rate)
	}
	p("\n| --- |")
	for range rates {
		p(" ---: |")
	}
	p("\n")
	for _, m := range modes {
		p("| %s (`%s`) |", findScenario(m).title, m)
		for _, rate := range rates {
			x := cell[m][rate]
			if x == nil {
				p(" |")
				continue
			}
			s := x.Steady
			v := fmt.Sprintf(" %.1f / %.1f", s.P50Ms, s.P99Ms)
			if !s.KeptUp {
				v += " (behind)"
			}
			p("%s |", v)
		}
		p("\n")
	}
	p("\n| mode | rate | produced (msgs/s) | p50 ms | p99 ms | max ms | produce→fetch p50 / p99 ms | last effect after last produce | msgs/tx | client CPU-s / 100k msgs | peak RSS MiB | WAL B / msg |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.steady {
		s := x.Steady
		if s == nil {
			continue
		}
		wal := "?"
		if x.WAL != nil {
			wal = fmt.Sprintf("%.0f", x.WAL.BytesPerMsg)
		}
		p("| `%s` | %d | %d (%.0f) | %.1f | %.1f | %.1f | %.1f / %.1f | %.0f ms | %.1f | %.2f | %.1f | %s |\n", x.Scenario, s.TargetRate,
			s.Produced, s.ProducedRate, s.P50Ms, s.P99Ms, s.MaxMs, s.FetchP50Ms, s.FetchP99Ms, s.DrainMs,
			float64(x.Messages)/float64(max(x.Txs, 1)),
			x.CPU.Self*1e5/float64(max(x.Messages, 1)), x.PeakRSSMiB, wal)
	}
}

// allocsPerMessage is the progress line's note on a round's heap
// allocations: empty for a child that does not measure them.
func allocsPerMessage(x *result) string {
	if !x.CPU.HeapOK || x.Messages == 0 {
		return ""
	}
	n := float64(x.Messages)
	return fmt.Sprintf(", %.0f B and %.1f objects allocated per message, %d GC cycles",
		float64(x.CPU.AllocBytes)/n, float64(x.CPU.AllocObjects)/n, x.CPU.GCCycles)
}

// cores formats CPU use during the measured interval in cores.
func cores(x *result) string {
	if x.Seconds <= 0 {
		return ""
	}
	f := func(v float64, ok bool) string {
		if !ok {
			return "?"
		}
		return fmt.Sprintf("%.2f", v/x.Seconds)
	}
	return strings.Join([]string{f(x.CPU.Self, true), f(x.CPU.Postgres, x.CPU.PostgresOK),
		f(x.CPU.Kafka, x.CPU.KafkaOK), f(x.CPU.MachineBusy, x.CPU.MachineOK)}, " / ")
}

func (r *report) writeJSON(path string) error {
	o := r.o
	doc := struct {
		Time       time.Time      `json:"time"`
		Go         string         `json:"go"`
		GOMAXPROCS int            `json:"gomaxprocs"`
		CPUs       int            `json:"cpus"`
		Postgres   string         `json:"postgres"`
		Messages   int            `json:"messages"`
		Partitions int            `json:"partitions"`
		Batch      int            `json:"batch"`
		Accounts   int            `json:"accounts"`
		Rates      []int          `json:"steady_rates"`
		SteadyFor  float64        `json:"steady_s"`
		Results    []*result      `json:"results"`
		Steady     []*result      `json:"steady"`
		Targets    []target       `json:"targets"`
		Scale      []*scaleResult `json:"scale,omitempty"`
	}{time.Now().UTC(), runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), r.pgVersion,
		o.messages, o.partitions, o.batch, o.accounts, o.rates, o.steady.Seconds(), r.results, r.steady, r.targets(),
		r.scale}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
