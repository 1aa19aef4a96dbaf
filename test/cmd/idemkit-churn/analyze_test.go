package main

import (
	"testing"
	"time"
)

func TestParseConfigs(t *testing.T) {
	t.Parallel()
	got, err := parseConfigs("A=10s/2.5s/10s, G=10s/1s/30s/term")
	if err != nil {
		t.Fatal(err)
	}
	want := []groupConfig{
		{Name: "A", Session: 10 * time.Second, Heartbeat: 2500 * time.Millisecond, Rebalance: 10 * time.Second},
		{Name: "G", Session: 10 * time.Second, Heartbeat: time.Second, Rebalance: 30 * time.Second, Graceful: true},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "A", "A=10s/1s", "A=10s/10s/5s", "A=10s/1s/5s/kill", "A=1s/0s/1s", "A=6s/1s/5s,A=6s/1s/5s"} {
		if _, err := parseConfigs(bad); err == nil {
			t.Errorf("parseConfigs(%q) succeeded", bad)
		}
	}
}

func TestLongestGap(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ts := []time.Time{at(-1), at(0.5), at(1), at(4), at(4.5), at(20)}
	if got := longestGap(ts, at(0), at(10)); got != 5500*time.Millisecond {
		t.Fatalf("longestGap = %s, want 5.5s (from the last timestamp to the end)", got)
	}
	if got := longestGap(ts, at(0), at(5)); got != 3*time.Second {
		t.Fatalf("longestGap = %s, want 3s", got)
	}
	if got := longestGap(nil, at(0), at(2)); got != 2*time.Second {
		t.Fatalf("longestGap without timestamps = %s, want the whole window", got)
	}
}

func TestResumeAfter(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	k := kill{Slot: 1, At: at(10), Exited: at(10.1)}
	// Partition 0 keeps applying after the kill, is reassigned at 16 and
	// applies at 16.5; partition 1 (the killed instance's) is reassigned at
	// 16 and applies at 17.
	assigns := []assignment{{Partition: 0, At: at(1)}, {Partition: 1, At: at(1)},
		{Partition: 0, At: at(16)}, {Partition: 1, At: at(16)}}
	perPart := [][]time.Time{{at(9), at(10.5), at(16.5)}, {at(9.9), at(17)}}
	got := resumeAfter(k, at(10), at(30), assigns, perPart)
	if got.Resume != 7*time.Second || got.Censored || got.At != 0 || got.Exit != 100*time.Millisecond {
		t.Fatalf("resumeAfter = %+v, want 7s after the kill, not censored", got)
	}
	// Partition 1 never applies again: the figure is a lower bound.
	perPart[1] = perPart[1][:1]
	if got := resumeAfter(k, at(10), at(30), assigns, perPart); !got.Censored || got.Resume != 20*time.Second {
		t.Fatalf("resumeAfter = %+v, want censored at 20s", got)
	}
}

func TestSettleAfter(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	states := []groupState{{At: at(8.1), State: "PreparingRebalance", Members: 4},
		{At: at(12), State: "Stable", Members: 3}, {At: at(30), State: "PreparingRebalance", Members: 2}}
	assigns := []assignment{{Partition: 0, At: at(12)}, {Partition: 1, At: at(12)}}
	perPart := [][]time.Time{{at(7), at(12.5)}, {at(7), at(13)}}
	if d, censored := settleAfter(at(8), at(20), 3, states, assigns, perPart); d != 5*time.Second || censored {
		t.Fatalf("settleAfter = %s, %v; want 5s (the last partition's first apply after its assignment)", d, censored)
	}
	if _, censored := settleAfter(at(8), at(20), 4, states, assigns, perPart); !censored {
		t.Fatal("settled without every instance in the group")
	}
	if d, censored := settleAfter(at(8), at(12.7), 3, states, assigns, perPart); !censored || d != 4700*time.Millisecond {
		t.Fatalf("settleAfter = %s, %v; want censored at 4.7s (partition 1 applied after the end)", d, censored)
	}
}
