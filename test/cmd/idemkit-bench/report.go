package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/idemkit/idemkit/consumer"
)

// Targets of issue 3, as ratios measured in one run.
const (
	targetBatchedVsPerMessage      = 8.0  // batched + per-message handler ≥ 8× per-message transactions
	targetBatchHandlerVsPerMessage = 25.0 // batched + batch handler ≥ 25× per-message transactions
	targetBatchHandlerVsPG         = 0.70 // batched + batch handler ≥ 70% of PostgreSQL alone
	targetPeakRSSMiB               = 64.0 // consumer peak RSS ≤ 64 MiB
)

type report struct {
	o       *options
	brokers []string

	pgVersion, pgFsync, pgSyncCommit, pgSharedBuffers string
	kafkaLocal                                        bool
	backlogSeconds                                    float64

	results []*result
}

func (r *report) find(name string) *result {
	for _, x := range r.results {
		if x.Scenario == name {
			return x
		}
	}
	return nil
}

// target is one checked target of issue 3.
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
			t.Got = fmt.Sprintf("%.0f%% (%.0f / %.0f msgs/s)", 100*t.Value, x.Rate, y.Rate)
		} else {
			t.Got = fmt.Sprintf("%.1f× (%.0f / %.0f msgs/s)", t.Value, x.Rate, y.Rate)
		}
		return t
	}
	out := []target{
		ratio("batched + per-message handler vs per-message transactions", "≥ 8×",
			"batched", "per-message", targetBatchedVsPerMessage, false),
		ratio("batched + batch handler vs per-message transactions", "≥ 25×",
			"batch-handler", "per-message", targetBatchHandlerVsPerMessage, false),
		ratio("batched + batch handler vs PostgreSQL alone, same SQL and batching", "≥ 70%",
			"batch-handler", "pg-batched", targetBatchHandlerVsPG, true),
	}
	rss := target{Name: "consumer peak RSS (largest of the consumer runs)", Want: "≤ 64 MiB",
		Got: "n/a (no consumer scenario ran)"}
	var worst *result
	for _, x := range r.results {
		if s := findScenario(x.Scenario); s.kind != kindPG && (worst == nil || x.PeakRSSMiB > worst.PeakRSSMiB) {
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

	if len(r.results) > 0 {
		p("\n| scenario | msgs/s (median) | rounds | × per-message | %% of PG-alone | peak RSS MiB | msgs/tx | CPU cores: client / PG backends / Kafka / machine |\n")
		p("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |\n")
		for _, x := range r.results {
			sc := findScenario(x.Scenario)
			times, pct := "", ""
			if base := r.find(sc.base); base != nil && base.Rate > 0 {
				times = fmt.Sprintf("%.1f×", x.Rate/base.Rate)
			}
			if pg := r.find(sc.pgAlone); pg != nil && pg.Rate > 0 {
				pct = fmt.Sprintf("%.0f%%", 100*x.Rate/pg.Rate)
			}
			rounds := make([]string, len(x.Rounds))
			for i, v := range x.Rounds {
				rounds[i] = fmt.Sprintf("%.0f", v)
			}
			p("| %s (`%s`) | %.0f | %s | %s | %s | %.1f | %.1f | %s |\n", sc.title, sc.name, x.Rate,
				strings.Join(rounds, " / "), times, pct, x.PeakRSSMiB, float64(x.Messages)/float64(max(x.Txs, 1)), cores(x))
		}
		p("\n× per-message: against `per-message` for consumer rows, against `pg-per-message` for PG-alone rows. " +
			"%% of PG-alone: against the PostgreSQL-alone run of the same SQL and batching " +
			"(`per-message`→`pg-per-message`, `batched`→`pg-batched-each`, `batch-handler`→`pg-batched`). " +
			"CPU: CPU-seconds per second of the measured interval; PG backends are the child's own connections, " +
			"Kafka and machine include whatever else runs on them.\n")

		p("\nWhere the partition workers' time goes (ms per transaction, share of worker time):\n\n")
		p("| scenario | fetch | linger + BEGIN + claim | handler | COMMIT |\n| --- | ---: | ---: | ---: | ---: |\n")
		for _, x := range r.results {
			s, total := x.Segments, x.Segments.total()
			if total <= 0 || x.Txs == 0 {
				continue
			}
			cell := func(d time.Duration) string {
				return fmt.Sprintf("%.2f (%.0f%%)", ms(d)/float64(x.Txs), 100*float64(d)/float64(total))
			}
			fetch := cell(s.Fetch)
			if findScenario(x.Scenario).kind == kindPG {
				fetch = "—"
			}
			p("| `%s` | %s | %s | %s | %s |\n", x.Scenario, fetch, cell(s.Claim), cell(s.Handle), cell(s.Commit))
		}
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
	if st := r.find("steady"); st != nil && st.Steady != nil {
		s := st.Steady
		kept := "kept up"
		if !s.KeptUp {
			kept = "did NOT keep up"
		}
		p("\nSteady rate (`steady`: batched, batch handler): %d msgs/s asked for %s; produced %d (%.0f msgs/s); "+
			"produce→commit latency p50 %.1f ms, p99 %.1f ms, max %.1f ms; last effect committed %.0f ms after the "+
			"last produce returned: %s (≤ %s); peak RSS %.1f MiB.\n",
			s.TargetRate, o.steady, s.Produced, s.ProducedRate, s.P50Ms, s.P99Ms, s.MaxMs, s.DrainMs, kept,
			steadyKeptUp, st.PeakRSSMiB)
	}

	p("\nTargets (issue 3):\n\n| target | wanted | measured | |\n| --- | --- | --- | --- |\n")
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
		Time       time.Time `json:"time"`
		Go         string    `json:"go"`
		GOMAXPROCS int       `json:"gomaxprocs"`
		CPUs       int       `json:"cpus"`
		Postgres   string    `json:"postgres"`
		Messages   int       `json:"messages"`
		Partitions int       `json:"partitions"`
		Batch      int       `json:"batch"`
		Accounts   int       `json:"accounts"`
		Results    []*result `json:"results"`
		Targets    []target  `json:"targets"`
	}{time.Now().UTC(), runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), r.pgVersion,
		o.messages, o.partitions, o.batch, o.accounts, r.results, r.targets()}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
