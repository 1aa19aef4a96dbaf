package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// report prints the comparison: one row per configuration and kill
// interval, with medians over the rounds (per kill: over the kills of all
// rounds) and ratios to the first configuration under the same interval.
type report struct {
	o    *options
	runs []*runResult
}

// cell is one configuration under one kill interval, over the rounds.
type cell struct {
	cfg    groupConfig
	every  time.Duration
	runs   []*runResult
	resume []time.Duration // every kill of every round
	resumeMedian, resumeMax,
	globalStall, globalStallMax, partStall time.Duration
	settle     time.Duration // last kill to a stable group with every partition flowing
	unsettled  int
	censored   int
	progress   float64
	rebalances float64
	dups       int
	joinErrs   int // errors other than Rebalance In Progress
	rip        int // Rebalance In Progress
	exact      bool
}

func (r *report) cells() []*cell {
	var out []*cell
	for _, every := range r.o.killEvery {
		for _, c := range r.o.configs {
			cl := &cell{cfg: c, every: every, exact: true}
			var gs, ps, st []time.Duration
			var prog, reb []float64
			for _, run := range r.runs {
				if run.Config.Name != c.Name || run.KillEvery != every {
					continue
				}
				cl.runs = append(cl.runs, run)
				for _, k := range run.Kills {
					cl.resume = append(cl.resume, k.Resume)
					if k.Censored {
						cl.censored++
					}
				}
				st = append(st, run.Settle)
				if run.SettleCensored {
					cl.unsettled++
				}
				gs = append(gs, run.GlobalStall)
				ps = append(ps, run.PartitionStall)
				prog = append(prog, run.ChurnProgress)
				reb = append(reb, float64(run.Rebalances))
				cl.dups += run.Duplicates
				for kind, n := range run.JoinErrors {
					if strings.Contains(kind, "Rebalance In Progress") {
						cl.rip += n
					} else {
						cl.joinErrs += n
					}
				}
				if run.Repeated > 0 || run.Missing > 0 || !run.Drained {
					cl.exact = false
				}
			}
			if len(cl.runs) == 0 {
				continue
			}
			cl.resumeMedian, cl.resumeMax = median(cl.resume), slices.Max(cl.resume)
			cl.globalStall, cl.globalStallMax, cl.partStall = median(gs), slices.Max(gs), median(ps)
			cl.progress, cl.rebalances = medianF(prog), medianF(reb)
			if len(st) > 0 {
				cl.settle = median(st)
			}
			out = append(out, cl)
		}
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func medianF(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func (r *report) print(w io.Writer) {
	cells := r.cells()
	if len(cells) == 0 {
		fmt.Fprintln(w, "no run finished")
		return
	}
	o := r.o
	fmt.Fprintf(w, "\n## Churn: time to resume after a kill\n\n")
	restart := "at once"
	if o.restart > 0 {
		restart = "after " + o.restart.String()
	}
	handler := ""
	if o.stopDelay > 0 {
		handler = fmt.Sprintf(", handler 10ms per message taking %s to stop when cancelled", o.stopDelay)
	}
	fmt.Fprintf(w, "%d instances, %d partitions, %d msgs/s, BatchSize %d%s; kills for %s per run, killed instances "+
		"restarted %s; %d round(s), "+
		"configurations alternated round by round. Times in seconds: per kill, median and max over the kills of "+
		"all rounds; per run, median (and max) over rounds. Ratios: to the first configuration under the same "+
		"kill interval. \">\" marks kills whose recovery the run did not see end (lower bounds).\n\n",
		o.instances, o.partitions, o.rate, o.batch, handler, o.churn, restart, o.rounds)
	fmt.Fprintln(w, "| kill every | config | session/heartbeat/rebalance | kills | resume median | × | resume max | "+
		"global stall median (max) | × | partition stall | settled after last kill | churn progress | rebalances | join errors (other / in progress) | duplicates | exactly once |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	base := map[time.Duration]*cell{}
	for _, c := range cells {
		if base[c.every] == nil {
			base[c.every] = c
		}
		b := base[c.every]
		maxs := secs(c.resumeMax)
		if c.censored > 0 {
			maxs = fmt.Sprintf(">%s (%d censored)", maxs, c.censored)
		}
		settle := secs(c.settle)
		if c.unsettled > 0 {
			settle = fmt.Sprintf(">%s (%d censored)", settle, c.unsettled)
		}
		exact := "yes"
		if !c.exact {
			exact = "NO"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %s | %s (%s) | %s | %s | %s | %.0f%% | %.1f | %d / %d | %d | %s |\n",
			c.every, c.cfg.Name, c.cfg, len(c.resume), secs(c.resumeMedian), ratio(c.resumeMedian, b.resumeMedian), maxs,
			secs(c.globalStall), secs(c.globalStallMax), ratio(c.globalStall, b.globalStall), secs(c.partStall), settle,
			100*c.progress, c.rebalances, c.joinErrs, c.rip, c.dups, exact)
	}
	fmt.Fprintln(w)
	for _, c := range cells {
		var per []string
		for _, run := range c.runs {
			var ks []string
			for _, k := range run.Kills {
				s := secs(k.Resume)
				if k.Censored {
					s = ">" + s
				}
				ks = append(ks, s)
			}
			per = append(per, fmt.Sprintf("r%d [%s]", run.Round, strings.Join(ks, " ")))
		}
		fmt.Fprintf(w, "- %s every %s, resume per kill: %s\n", c.cfg.Name, c.every, strings.Join(per, "; "))
	}
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(b))
}

func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r.runs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
