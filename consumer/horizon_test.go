package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// at is msg with a record timestamp.
func at(m kafka.Message, t time.Time) kafka.Message {
	m.Time = t
	return m
}

// horizonNotes records the outcomes beyond the horizon and OnFailure.
type horizonNotes struct {
	mu      sync.Mutex
	hooked  map[string][]bool // applied, per call
	failed  map[string]error
	horizon map[string]*consumer.HorizonError
}

func newHorizonNotes() *horizonNotes {
	return &horizonNotes{hooked: map[string][]bool{}, failed: map[string]error{}, horizon: map[string]*consumer.HorizonError{}}
}

func (n *horizonNotes) hook(_ context.Context, m *consumer.Message, err *consumer.HorizonError, applied bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hooked[m.ID] = append(n.hooked[m.ID], applied)
	n.horizon[m.ID] = err
}

func (n *horizonNotes) onFailure(_ context.Context, m *consumer.Message, err error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.failed[m.ID] = err
	return nil
}

// TestBeyondHorizon: with Retention set, a message older than the horizon
// whose claim is new is not applied but goes to OnFailure with
// ErrBeyondHorizon (HorizonFail, the default), or is applied and counted
// (HorizonApply); one whose record is still there is a duplicate either way;
// messages within the horizon, and every message without Retention, are
// applied as before.
func TestBeyondHorizon(t *testing.T) {
	t.Parallel()
	type policy struct {
		name      string
		retention time.Duration
		on        consumer.HorizonPolicy
	}
	policies := []policy{
		{"fail", time.Hour, consumer.HorizonFail},
		{"apply", time.Hour, consumer.HorizonApply},
		{"no-retention", 0, consumer.HorizonFail},
	}
	for _, md := range modes {
		for _, p := range policies {
			t.Run(md.name+"/"+p.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := newEnv(t, 1)
				now := time.Now()
				old := now.Add(-2 * time.Hour)
				// A message whose record is kept: a duplicate, however old.
				if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
					_, err := e.store.ClaimTx(ctx, tx, dedup.Claim{Consumer: e.group, MessageID: "old-dup", Topic: e.topic})
					return err
				}); err != nil {
					t.Fatal(err)
				}
				e.produce(
					at(msg("fresh-1", "a", 1), now),
					at(msg("old-new", "b", 1), old),
					at(msg("old-dup", "c", 1), old),
					at(msg("edge", "d", 1), now.Add(-50*time.Minute)), // within 1h minus the 5m margin
					at(msg("old-new-2", "e", 1), old),
					at(msg("fresh-2", "f", 1), now),
				)
				notes := newHorizonNotes()
				oc := newOutcomes(6)
				cfg := e.config(md, nil)
				cfg.Retention, cfg.OnBeyondHorizon = p.retention, p.on
				cfg.OnFailure = notes.onFailure
				testobs.Of(cfg).OnOutcome = oc.hook
				testobs.Of(cfg).OnBeyondHorizon = notes.hook
				stop := run(t, e.db.Pool, cfg)
				wait(t, oc.done, "six outcomes")
				if err := stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}

				beyond := []string{"old-new", "old-new-2"}
				wantApplied := map[string]bool{"fresh-1": true, "edge": true, "fresh-2": true}
				oc.mu.Lock()
				defer oc.mu.Unlock()
				notes.mu.Lock()
				defer notes.mu.Unlock()
				if got := oc.ids["old-dup"]; len(got) != 1 || got[0] != consumer.Duplicate {
					t.Fatalf("old message with its record kept: %v, want duplicate", got)
				}
				for id := range wantApplied {
					if got := oc.ids[id]; len(got) != 1 || got[0] != consumer.Applied {
						t.Fatalf("%s: %v, want applied", id, got)
					}
				}
				runs := e.runs()
				for _, id := range beyond {
					got := oc.ids[id]
					switch {
					case p.retention == 0 || p.on == consumer.HorizonApply:
						if len(got) != 1 || got[0] != consumer.Applied || runs[id] != 1 {
							t.Fatalf("%s (%s): outcomes %v, effect runs %d; want applied once", id, p.name, got, runs[id])
						}
					default:
						if len(got) != 1 || got[0] != consumer.Failed || runs[id] != 0 {
							t.Fatalf("%s (%s): outcomes %v, effect runs %d; want failed, never applied", id, p.name, got, runs[id])
						}
						err := notes.failed[id]
						var merr *consumer.MessageError
						var herr *consumer.HorizonError
						if !errors.Is(err, consumer.ErrBeyondHorizon) || !errors.As(err, &merr) || !errors.As(err, &herr) ||
							merr.Class != retry.ClassPermanent || merr.Attempts != 1 || !retry.IsPermanent(err) {
							t.Fatalf("%s: OnFailure got %v; want a permanent *MessageError with a *HorizonError after 1 attempt", id, err)
						}
						if herr.Horizon != 55*time.Minute || herr.Age < 2*time.Hour || !herr.Time.Equal(old.Truncate(time.Millisecond)) {
							t.Fatalf("%s: %+v; want horizon 55m, age over 2h, time %s", id, herr, old)
						}
						// The claim went with the rollback: nothing marks it done.
						if ok, err := e.store.Processed(ctx, e.db.Pool, e.group, id); err != nil || ok {
							t.Fatalf("%s: Processed = %v, %v; want false", id, ok, err)
						}
					}
					switch wantHook := p.retention > 0; {
					case !wantHook && len(notes.hooked[id]) != 0:
						t.Fatalf("%s without Retention: BeyondHorizon hook called %v", id, notes.hooked[id])
					case wantHook && (len(notes.hooked[id]) != 1 || notes.hooked[id][0] != (p.on == consumer.HorizonApply)):
						t.Fatalf("%s: BeyondHorizon hook calls %v; want one, applied=%v", id, notes.hooked[id], p.on == consumer.HorizonApply)
					}
				}
				if len(notes.hooked) > len(beyond) {
					t.Fatalf("BeyondHorizon hook calls %v; want only %v", notes.hooked, beyond)
				}
				if runs["fresh-2"] != 1 || runs["old-dup"] != 0 {
					t.Fatalf("effect runs %v", runs)
				}
			})
		}
	}
}

// TestBeyondHorizonStopsWithoutOnFailure: with no OnFailure, a message
// beyond the horizon stops the runner, as any message that failed for good:
// it is neither applied nor skipped.
func TestBeyondHorizonStopsWithoutOnFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(at(msg("old", "k", 1), time.Now().Add(-3*time.Hour)))
	cfg := e.config(baseModes[1], nil)
	cfg.Retention = 2 * time.Hour
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	err = r.Run(ctx)
	var merr *consumer.MessageError
	if !errors.Is(err, consumer.ErrBeyondHorizon) || !errors.As(err, &merr) || merr.ID != "old" {
		t.Fatalf("Run: %v; want a *MessageError for \"old\" matching ErrBeyondHorizon", err)
	}
	if runs := e.runs(); len(runs) != 0 {
		t.Fatalf("effects %v; want none", runs)
	}
}

func TestHorizonConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	for _, c := range []struct {
		name      string
		retention time.Duration
		margin    time.Duration
		on        consumer.HorizonPolicy
		ok        bool
	}{
		{"defaults", time.Hour, 0, consumer.HorizonFail, true},
		{"margin equal to retention", time.Hour, time.Hour, consumer.HorizonFail, false},
		{"negative margin", time.Hour, -time.Second, consumer.HorizonFail, false},
		{"unknown policy", time.Hour, 0, consumer.HorizonPolicy(7), false},
		{"no retention, margin unused", 0, time.Hour, consumer.HorizonApply, true},
	} {
		cfg := e.config(baseModes[0], nil)
		cfg.Retention, cfg.HorizonMargin, cfg.OnBeyondHorizon = c.retention, c.margin, c.on
		_, err := consumer.New(e.db.Pool, cfg)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, consumer.ErrInvalidConfig)) {
			t.Fatalf("%s: New: %v; want ok=%v", c.name, err, c.ok)
		}
	}
}
