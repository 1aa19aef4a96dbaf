package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestListStates: List joins the replay records: each dead letter gets its
// state, dead letters group per origin message, and a message's state is
// that of its latest round, so that only messages nobody decided count as
// unresolved.
func TestListStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group, Logger: e.logger})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e.deadLetter(w, "applied", 0)
	e.deadLetter(w, "twice", 1)
	e.deadLetter(w, "twice", 1) // a copy: one message
	e.deadLetter(w, "again", 2)
	e.deadLetter(w, "spent", 3)
	failing := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "again" || m.ID == "spent" {
			return errors.New("still broken")
		}
		return e.effect(ctx, tx, m)
	}
	// spent fails in its last round; again fails and goes around once more.
	if _, err := e.reprocessor(dlq.Redrive, failing, func(c *dlq.ReprocessorConfig) {
		c.ReplayLimit, c.Filter = 1, dlq.Filter{MessageIDs: []string{"spent"}}
	}).Run(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reprocessor(dlq.Redrive, failing, nil).Run(ctx); err != nil {
		t.Fatal(err)
	}
	e.deadLetter(w, "republished", 4)
	if _, err := e.reprocessor(dlq.Republish, nil, func(c *dlq.ReprocessorConfig) {
		c.Filter = dlq.Filter{MessageIDs: []string{"republished"}}
	}).Run(ctx); err != nil {
		t.Fatal(err)
	}
	e.deadLetter(w, "new", 5)

	l, err := dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{e.dlq}, Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	type letter struct {
		round int
		state dlq.State
	}
	want := []struct {
		id      string
		state   dlq.State
		letters []letter
	}{
		{"applied", dlq.StateApplied, []letter{{0, dlq.StateApplied}}},
		{"twice", dlq.StateApplied, []letter{{0, dlq.StateApplied}, {0, dlq.StateApplied}}},
		{"again", dlq.StateUnresolved, []letter{{0, dlq.StateSuperseded}, {1, dlq.StateUnresolved}}},
		{"spent", dlq.StateExhausted, []letter{{0, dlq.StateExhausted}}},
		{"republished", dlq.StateReplayed, []letter{{0, dlq.StateReplayed}}},
		{"new", dlq.StateUnresolved, []letter{{0, dlq.StateUnresolved}}},
	}
	if l.Read != 8 || len(l.Messages) != len(want) {
		t.Fatalf("read %d, %d messages; want 8 and %d", l.Read, len(l.Messages), len(want))
	}
	for i, w := range want {
		m := l.Messages[i]
		var got []letter
		for _, x := range m.Letters {
			got = append(got, letter{x.Round, x.State})
		}
		if m.MessageID != w.id || m.State != w.state || len(got) != len(w.letters) {
			t.Fatalf("message %d: %s %s %v; want %s %s %v", i, m.MessageID, m.State, got, w.id, w.state, w.letters)
		}
		for j := range got {
			if got[j] != w.letters[j] {
				t.Fatalf("message %s: letters %v, want %v", m.MessageID, got, w.letters)
			}
		}
	}
	if r := l.Messages[3].Letters[0].Replay; r == nil || r.Outcome != dlq.Exhausted || r.ReplayedBy != "test" {
		t.Fatalf("spent's replay record %+v", r)
	}
	if got := l.States; !maps.Equal(got, map[dlq.State]int{dlq.StateApplied: 2, dlq.StateUnresolved: 2,
		dlq.StateExhausted: 1, dlq.StateReplayed: 1}) {
		t.Fatalf("count %v", got)
	}
	// A filter selects dead letters; states still come from all of them.
	l, err = dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{e.dlq}, Tables: migrate.Tables{Schema: e.db.Schema},
		Filter: dlq.Filter{MessageIDs: []string{"again"}}, NoPayload: true})
	if err != nil || len(l.Messages) != 1 || l.Messages[0].State != dlq.StateUnresolved || len(l.Messages[0].Letters) != 2 ||
		l.Messages[0].Letters[0].Message.Value != nil {
		t.Fatalf("filtered: %+v, %v", l, err)
	}
	// Without headers: what Parse read from them is kept.
	l, err = dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{e.dlq}, Tables: migrate.Tables{Schema: e.db.Schema},
		Filter: dlq.Filter{MessageIDs: []string{"again"}}, NoPayload: true, DropHeaders: true})
	if err != nil || len(l.Messages) != 1 || l.Messages[0].State != dlq.StateUnresolved || len(l.Messages[0].Letters) != 2 {
		t.Fatalf("without headers: %+v, %v", l, err)
	}
	for _, x := range l.Messages[0].Letters {
		if x.Message.Headers != nil || x.MessageID != "again" || len(x.History) == 0 || x.Origin.Topic == "" {
			t.Fatalf("without headers: letter %+v", x.DeadLetter)
		}
	}
	// A window keeps one page of the selected letters, in the order read,
	// and counts every selected letter and message.
	full := map[dlq.State]int{dlq.StateApplied: 2, dlq.StateUnresolved: 2, dlq.StateExhausted: 1, dlq.StateReplayed: 1}
	page := func(f dlq.Filter, w *dlq.Window) *dlq.Listing {
		t.Helper()
		l, err := dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{e.dlq},
			Tables: migrate.Tables{Schema: e.db.Schema}, Filter: f, NoPayload: true, Window: w})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	shape := func(l *dlq.Listing) (out []string) {
		for _, m := range l.Messages {
			for _, x := range m.Letters {
				out = append(out, fmt.Sprintf("%s/%d:%s", x.MessageID, x.Round, x.State))
			}
			out = append(out, "="+string(m.State))
		}
		return out
	}
	l = page(dlq.Filter{}, &dlq.Window{Skip: 3, Limit: 3})
	if got, want := shape(l), []string{"again/0:superseded", "again/1:unresolved", "=unresolved", "spent/0:exhausted", "=exhausted"}; !slices.Equal(got, want) ||
		l.Selected != 8 || !maps.Equal(l.States, full) {
		t.Fatalf("window 3+3: %v, %d selected, %v; want %v, 8, %v", got, l.Selected, l.States, want, full)
	}
	if l = page(dlq.Filter{}, &dlq.Window{Skip: 8, Limit: 3}); len(l.Messages) != 0 || l.Selected != 8 || !maps.Equal(l.States, full) {
		t.Fatalf("window past the end: %v, %d selected, %v", shape(l), l.Selected, l.States)
	}
	l = page(dlq.Filter{MessageIDs: []string{"again"}}, &dlq.Window{Skip: 1, Limit: 5})
	if got, want := shape(l), []string{"again/1:unresolved", "=unresolved"}; !slices.Equal(got, want) || l.Selected != 2 ||
		!maps.Equal(l.States, map[dlq.State]int{dlq.StateUnresolved: 1}) {
		t.Fatalf("filtered window: %v, %d selected, %v", got, l.Selected, l.States)
	}
	if _, err := dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{e.dlq},
		Window: &dlq.Window{Skip: -1}}); !errors.Is(err, dlq.ErrInvalidConfig) {
		t.Fatalf("a negative window: %v, want ErrInvalidConfig", err)
	}
	// The error class of the last failure selects.
	classes := map[string]int{}
	for _, d := range e.deadLetters() {
		classes[d.Last().Class]++
	}
	if len(classes) < 2 {
		t.Fatalf("the letters' classes %v: want two at least to filter by one", classes)
	}
	for class, n := range classes {
		l := page(dlq.Filter{Class: class}, nil)
		if l.Selected != n {
			t.Errorf("class %s: %d selected, want %d", class, l.Selected, n)
		}
		for _, m := range l.Messages {
			for _, x := range m.Letters {
				if x.Last().Class != class {
					t.Errorf("class %s: kept %s/%d of class %s", class, x.MessageID, x.Round, x.Last().Class)
				}
			}
		}
	}
	// Read on one connection (as a Monitor does), and without a database:
	// a nil pool, typed or not, reads no replay record.
	conn, err := e.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	cfg := &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{e.dlq}, Tables: migrate.Tables{Schema: e.db.Schema}}
	if l, err := dlq.List(ctx, conn.Conn(), cfg); err != nil || !maps.Equal(l.States, map[dlq.State]int{dlq.StateApplied: 2,
		dlq.StateUnresolved: 2, dlq.StateExhausted: 1, dlq.StateReplayed: 1}) {
		t.Fatalf("on one connection: %v, %v", l, err)
	}
	for _, db := range []dlq.DBTX{nil, (*pgxpool.Pool)(nil)} {
		l, err := dlq.List(ctx, db, cfg)
		if err != nil || len(l.Messages) != 6 {
			t.Fatalf("List(%T nil): %v, %v", db, l, err)
		}
		for _, m := range l.Messages {
			if m.State != "" {
				t.Fatalf("List(%T nil): message %+v in state %q, want unknown", db, m.Origin, m.State)
			}
		}
	}
}
