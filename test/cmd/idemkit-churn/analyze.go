package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// runResult is what one run measured.
type runResult struct {
	Config    groupConfig   `json:"config"`
	KillEvery time.Duration `json:"kill_every_ns"`
	Round     int           `json:"round"`
	Kills     []killResult  `json:"kills"`
	// GlobalStall is the longest time, from the first kill to the end of the
	// run, in which no message was applied anywhere.
	GlobalStall time.Duration `json:"global_stall_ns"`
	// PartitionStall is the longest time a single partition applied nothing.
	PartitionStall time.Duration `json:"partition_stall_ns"`
	// ChurnProgress is the messages applied during the churn over those
	// produced in that time.
	ChurnProgress float64 `json:"churn_progress"`
	// Rebalances counts the times DescribeGroups saw the group enter
	// PreparingRebalance from the first kill on (polled every 100ms: a
	// lower bound).
	Rebalances int            `json:"rebalances"`
	Produced   int64          `json:"produced"`
	Applied    int64          `json:"applied"`     // distinct IDs with an effect
	Missing    int64          `json:"missing"`     // produced IDs without an effect
	Repeated   int64          `json:"repeated"`    // IDs whose effect ran more than once
	Duplicates int            `json:"duplicates"`  // redeliveries the dedup store stopped
	JoinErrors map[string]int `json:"join_errors"` // errors consumer group Next returned, by kind
	Settled    bool           `json:"settled"`     // every partition resumed within -settle
	// Settle runs from the last kill until the group was stable with every
	// instance (as it stayed to the end of the run) and every partition had
	// applied a message since its last assignment. With SettleCensored the
	// run ended first and Settle is a lower bound.
	Settle         time.Duration  `json:"settle_ns"`
	SettleCensored bool           `json:"settle_censored,omitempty"`
	Drained        bool           `json:"drained"`     // every produced message applied at the end
	Duration       time.Duration  `json:"observed_ns"` // first kill to end of run
	States         []groupStateAt `json:"states"`
	Assigns        []assignmentAt `json:"assignments"`
}

// killResult is one kill's recovery.
type killResult struct {
	Slot   int           `json:"slot"`
	At     time.Duration `json:"at_ns"`   // since the first kill
	Exit   time.Duration `json:"exit_ns"` // signal to process reaped
	Resume time.Duration `json:"resume_ns"`
	// Censored: the run ended before every partition resumed; Resume is the
	// time observed, a lower bound.
	Censored bool `json:"censored,omitempty"`
}

type groupStateAt struct {
	At      time.Duration `json:"at_ns"` // since the first kill
	State   string        `json:"state"`
	Members int           `json:"members"`
}

type assignmentAt struct {
	At        time.Duration `json:"at_ns"`
	Instance  string        `json:"instance"`
	Partition int           `json:"partition"`
}

// analyze reads the effects of the run and computes its figures. first is
// the first kill, churnEnd the end of the churn, end the end of the observed
// window (when production stopped).
func (r *churnRun) analyze(ctx context.Context, kills []kill, first, churnEnd, end time.Time, produced int64) (*runResult, error) {
	res := &runResult{Config: r.cfg, KillEvery: r.every, Round: r.round, Produced: produced, Duration: end.Sub(first)}
	err := r.h.admin.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM `+r.table()+`),
		(SELECT count(*) FROM `+r.table()+` WHERE runs <> 1),
		(SELECT count(*) FROM generate_series(0, $1::bigint - 1) g
			WHERE NOT EXISTS (SELECT FROM `+r.table()+` e WHERE e.id = 'm-' || g))`, produced).
		Scan(&res.Applied, &res.Repeated, &res.Missing)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	rows, err := r.h.admin.Query(ctx, `SELECT part, applied_at FROM `+r.table()+` ORDER BY applied_at`)
	if err != nil {
		return nil, err
	}
	type apply struct {
		Part int
		At   time.Time
	}
	applies, err := pgx.CollectRows(rows, pgx.RowToStructByPos[apply])
	if err != nil {
		return nil, err
	}
	perPart := make([][]time.Time, r.h.o.partitions)
	var all []time.Time
	for _, a := range applies {
		if a.Part >= 0 && a.Part < len(perPart) {
			perPart[a.Part] = append(perPart[a.Part], a.At)
		}
		all = append(all, a.At)
		if !a.At.Before(first) && a.At.Before(churnEnd) {
			res.ChurnProgress++
		}
	}
	res.ChurnProgress /= float64(r.h.o.rate) * churnEnd.Sub(first).Seconds()
	res.GlobalStall = longestGap(all, first, end)
	for _, ts := range perPart {
		res.PartitionStall = max(res.PartitionStall, longestGap(ts, first, end))
	}

	r.mu.Lock()
	assigns := slices.Clone(r.assigns)
	states := slices.Clone(r.states)
	res.Duplicates = r.dups
	r.mu.Unlock()
	sort.Slice(assigns, func(i, j int) bool { return assigns[i].At.Before(assigns[j].At) })
	for _, k := range kills {
		res.Kills = append(res.Kills, resumeAfter(k, first, end, assigns, perPart))
	}
	if len(kills) > 0 {
		res.Settle, res.SettleCensored = settleAfter(kills[len(kills)-1].At, end, len(r.slots), states, assigns, perPart)
	}
	for i, s := range states {
		if s.At.Before(first) {
			continue
		}
		if s.State == "PreparingRebalance" && (i == 0 || states[i-1].State != "PreparingRebalance") {
			res.Rebalances++
		}
		res.States = append(res.States, groupStateAt{At: s.At.Sub(first), State: s.State, Members: s.Members})
	}
	for _, a := range assigns {
		if !a.At.Before(first) {
			res.Assigns = append(res.Assigns, assignmentAt{At: a.At.Sub(first), Instance: a.Instance, Partition: a.Partition})
		}
	}
	res.JoinErrors, err = joinErrors(r.log.Name())
	if err != nil {
		return nil, err
	}
	return res, nil
}

// resumeAfter is the time from the kill until every partition was assigned
// again (by any instance) and applied a message after that assignment.
func resumeAfter(k kill, first, end time.Time, assigns []assignment, perPart [][]time.Time) killResult {
	kr := killResult{Slot: k.Slot, At: k.At.Sub(first), Exit: k.Exited.Sub(k.At)}
	var resumed time.Time
	for p, ts := range perPart {
		i := slices.IndexFunc(assigns, func(a assignment) bool { return a.Partition == p && !a.At.Before(k.At) })
		if i < 0 {
			kr.Resume, kr.Censored = end.Sub(k.At), true
			return kr
		}
		j, _ := slices.BinarySearchFunc(ts, assigns[i].At, func(t, target time.Time) int { return t.Compare(target) })
		if j == len(ts) {
			kr.Resume, kr.Censored = end.Sub(k.At), true
			return kr
		}
		if ts[j].After(resumed) {
			resumed = ts[j]
		}
	}
	kr.Resume = resumed.Sub(k.At)
	return kr
}

// settleAfter is the time from the last kill until the group was stable
// with every instance, in the state it kept until end, and every partition
// applied a message after its last assignment; censored when that did not
// happen by end.
func settleAfter(last, end time.Time, instances int, states []groupState, assigns []assignment, perPart [][]time.Time) (time.Duration, bool) {
	censored := func() (time.Duration, bool) { return end.Sub(last), true }
	i := slices.IndexFunc(states, func(s groupState) bool { return s.At.After(end) })
	if i < 0 {
		i = len(states)
	}
	if i == 0 || states[i-1].State != "Stable" || states[i-1].Members != instances {
		return censored()
	}
	settled := states[i-1].At
	for p, ts := range perPart {
		var at time.Time
		for _, a := range assigns {
			if a.Partition == p && !a.At.After(end) && a.At.After(at) {
				at = a.At
			}
		}
		if at.Before(last) {
			return censored()
		}
		j, _ := slices.BinarySearchFunc(ts, at, func(t, target time.Time) int { return t.Compare(target) })
		if j == len(ts) || ts[j].After(end) {
			return censored()
		}
		if ts[j].After(settled) {
			settled = ts[j]
		}
	}
	return max(settled.Sub(last), 0), false
}

// longestGap is the longest time within [from, to] without a timestamp of
// ts (sorted).
func longestGap(ts []time.Time, from, to time.Time) time.Duration {
	prev, gap := from, time.Duration(0)
	for _, t := range ts {
		if t.Before(from) {
			continue
		}
		if t.After(to) {
			break
		}
		gap = max(gap, t.Sub(prev))
		prev = t
	}
	return max(gap, to.Sub(prev))
}

var (
	joinErrLine = regexp.MustCompile(`msg="consumer group: waiting for a generation".* err="?(\[\d+\] [^:"]+|[^"]{1,60})`)
)

// joinErrors counts the errors the instances' consumer groups returned from
// Next (logged by the runner), by kind. Each error other than Rebalance In
// Progress made kafka-go leave the group and wait JoinGroupBackoff.
func joinErrors(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if m := joinErrLine.FindStringSubmatch(sc.Text()); m != nil {
			out[strings.TrimSpace(m[1])]++
		}
	}
	return out, sc.Err()
}

// verify fails a run that lost or repeated an effect.
func (res *runResult) verify() error {
	if res.Repeated > 0 {
		return fmt.Errorf("EXACTLY-ONCE VIOLATED: %d message IDs were applied more than once", res.Repeated)
	}
	if res.Drained && res.Missing > 0 {
		return fmt.Errorf("LOST: %d produced message IDs have no effect", res.Missing)
	}
	return nil
}

func (res *runResult) summary() string {
	var rs []string
	for _, k := range res.Kills {
		s := secs(k.Resume)
		if k.Censored {
			s = ">" + s
		}
		rs = append(rs, s)
	}
	return fmt.Sprintf("resume per kill [%s] s; global stall %s s; partition stall %s s; churn progress %.0f%%; "+
		"rebalances %d; duplicates %d; join errors %v; %d produced, %d applied, %d missing, %d repeated",
		strings.Join(rs, " "), secs(res.GlobalStall), secs(res.PartitionStall), 100*res.ChurnProgress,
		res.Rebalances, res.Duplicates, res.JoinErrors, res.Produced, res.Applied, res.Missing, res.Repeated)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }
