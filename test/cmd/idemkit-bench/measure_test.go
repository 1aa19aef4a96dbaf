package main

import (
	"strings"
	"testing"
	"time"
)

// TestRoundOrder: even rounds run the scenarios in reverse, and a consumer
// scenario stays next to its PostgreSQL-alone counterpart.
func TestRoundOrder(t *testing.T) {
	a, b, c := &scenario{name: "a"}, &scenario{name: "b"}, &scenario{name: "c"}
	scs := []*scenario{a, b, c}
	for round, want := range map[int]string{1: "abc", 2: "cba", 3: "abc", 4: "cba"} {
		got := ""
		for _, sc := range roundOrder(scs, round) {
			got += sc.name
		}
		if got != want {
			t.Errorf("round %d runs %s, want %s", round, got, want)
		}
	}
	if scs[0] != a || scs[2] != c {
		t.Error("roundOrder changed the list it was given")
	}
}

// TestWorkerClockSegments: a transaction's time splits at its TxStart, its
// first handler call, BeforeCommit and AfterCommit; a start that belongs to
// an earlier transaction leaves the wait and claim unsplit.
func TestWorkerClockSegments(t *testing.T) {
	c := newWorkerClock(1)
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	c.afterCommit(0, 1, at(0)) // the transaction before: no handler, only its end
	c.txStarted(0, at(2))
	c.handlerStarted(0, at(5))
	c.handlerStarted(0, at(6)) // a second handler call of the same transaction
	c.beforeCommit(0, at(15))
	c.afterCommit(0, 1, at(20))
	seg, txs, msgs := c.sum()
	want := segments{Wait: 2 * time.Millisecond, Claim: 3 * time.Millisecond, Handle: 10 * time.Millisecond,
		Commit: 5 * time.Millisecond}
	if seg != want || txs != 1 || msgs != 1 {
		t.Fatalf("segments %+v, %d txs, %d msgs; want %+v, 1, 1", seg, txs, msgs, want)
	}

	// No TxStart since the last commit: the start seen is stale.
	c.handlerStarted(0, at(25))
	c.beforeCommit(0, at(30))
	c.afterCommit(0, 1, at(32))
	seg, _, _ = c.sum()
	want.Unsplit = 5 * time.Millisecond
	want.Handle += 5 * time.Millisecond
	want.Commit += 2 * time.Millisecond
	if seg != want {
		t.Fatalf("after a transaction without a start: %+v, want %+v", seg, want)
	}
}

// sink keeps TestCPUMeterHeap's allocations from being optimized away.
var sink [][]byte

// TestCPUMeterHeap: the meter counts the heap allocations made between
// begin and end, and the progress note reports them per message.
func TestCPUMeterHeap(t *testing.T) {
	m := &cpuMeter{}
	m.begin()
	for range 1000 {
		sink = append(sink, make([]byte, 1024))
	}
	sink = nil
	m.end()
	u := m.result()
	if !u.HeapOK || u.AllocBytes < 1000*1024 || u.AllocObjects < 1000 {
		t.Fatalf("heap usage %+v; want at least 1000 objects and 1000 KiB", u)
	}
	note := allocsPerMessage(&result{Messages: 1000, CPU: u})
	if !strings.Contains(note, "objects allocated per message") {
		t.Errorf("progress note %q", note)
	}
	if allocsPerMessage(&result{Messages: 1000}) != "" {
		t.Error("a result without heap figures (the Watermill peer) has a note")
	}
}

// TestRoundRatios: round i of one scenario is compared with round i of the
// other, and the median of an even count is the mean of the middle two.
func TestRoundRatios(t *testing.T) {
	lo, med, hi, ok := roundRatios([]float64{90, 200, 50, 30}, []float64{100, 200, 100, 20})
	if !ok || lo != 0.5 || hi != 1.5 || med != 0.95 {
		t.Errorf("got %v %v %v %v; want 0.5, 0.95, 1.5", lo, med, hi, ok)
	}
	if _, med, _, _ := roundRatios([]float64{1, 2, 3}, []float64{1, 1, 1}); med != 2 {
		t.Errorf("median of three: %v, want 2", med)
	}
	if _, _, _, ok := roundRatios([]float64{1}, []float64{1}); ok {
		t.Error("one round gave round-by-round ratios")
	}
	if _, _, _, ok := roundRatios([]float64{1, 1}, []float64{1, 0}); ok {
		t.Error("a round of 0 msgs/s gave ratios")
	}
}
