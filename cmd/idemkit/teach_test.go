package main

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

const (
	card       = "4111111111111111"
	cardSpaced = "4111 1111 1111 1111"
	bearer     = "Bearer sk_live_abcdef"
)

// TestCLIRedaction: dlq list and inspect redact by default — a card number
// in the value, in a free-text field and in the error keeps its last four
// digits only, a sensitive JSON field and the Authorization header are
// masked whole — in text and in -json; -redact-fields and -redact-regexp
// mask more; -show-payload shows everything verbatim; -redact with
// -show-payload is bad usage.
func TestCLIRedaction(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	env := []string{"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	value := `{"card_number":"` + card + `","note":"paid with ` + cardSpaced + `","amount":12,"customer":"ada@example.com"}`
	m := &consumer.Message{ID: "pay-1", Message: kafka.Message{Topic: origin, Offset: 3, Key: []byte("acct-" + card),
		Value: []byte(value), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("pay-1")},
			{Key: "Authorization", Value: []byte(bearer)}}}}
	merr := &consumer.MessageError{Topic: origin, Offset: 3, ID: "pay-1", Attempts: 1, Class: retry.ClassPermanent,
		FirstFailure: now, LastFailure: now, Err: errors.New("card " + card + " declined")}
	if err := w.OnFailure(context.Background(), m, merr); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	secrets := []string{card, cardSpaced, bearer, "sk_live"}
	noSecrets := func(what, out string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("%s shows %q:\n%s", what, s, out)
			}
		}
	}

	out, errOut, code := cli(t, bin, env, "dlq", "inspect", "-topic", dead, "-id", "pay-1")
	if code != 0 {
		t.Fatalf("inspect: exit %d %s", code, errOut)
	}
	noSecrets("inspect", out)
	for _, want := range []string{`"card_number":"***"`, "paid with **** **** **** 1111", `card ************1111 declined`,
		"Authorization: ***", `"amount":12`, "ada@example.com", "(redacted: -show-payload"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	out, _, code = cli(t, bin, env, "dlq", "inspect", "-topic", dead, "-id", "pay-1", "-redact")
	if code != 0 {
		t.Fatalf("inspect -redact: exit %d", code)
	}
	noSecrets("inspect -redact", out)

	out, _, code = cli(t, bin, env, "dlq", "list", "-topic", dead)
	if code != 0 || !strings.Contains(out, "card ************1111 declined") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	noSecrets("list", out)

	// -json: the same, redacted.
	out, _, code = cli(t, bin, env, "dlq", "inspect", "-topic", dead, "-id", "pay-1", "-json")
	var letters []letterJSON
	if err := json.Unmarshal([]byte(out), &letters); code != 0 || err != nil || len(letters) != 1 {
		t.Fatalf("inspect -json: exit %d, %v\n%s", code, err, out)
	}
	noSecrets("inspect -json", out)
	if l := letters[0]; !l.Redacted || l.MessageID != "pay-1" || l.Origin.Topic != origin || l.Origin.Offset != 3 ||
		l.Value == nil || !strings.Contains(*l.Value, `"card_number":"***"`) || l.Key == nil || *l.Key != "acct-************1111" ||
		len(l.History) != 1 || l.History[0].Error != "card ************1111 declined" {
		t.Fatalf("inspect -json: %+v", l)
	}
	out, _, code = cli(t, bin, env, "dlq", "list", "-topic", dead, "-json")
	var list struct {
		Read        int          `json:"read"`
		DeadLetters []letterJSON `json:"dead_letters"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || list.Read != 1 || len(list.DeadLetters) != 1 ||
		list.DeadLetters[0].MessageID != "pay-1" {
		t.Fatalf("list -json: exit %d, %v\n%s", code, err, out)
	}
	noSecrets("list -json", out)

	// More fields, a regexp, from flags and from the environment.
	out, _, code = cli(t, bin, env, "dlq", "inspect", "-topic", dead, "-id", "pay-1", "-redact-fields", "customer",
		"-redact-regexp", "paid with")
	if code != 0 || strings.Contains(out, "ada@example.com") || strings.Contains(out, "paid with") || !strings.Contains(out, `"customer":"***"`) {
		t.Fatalf("-redact-fields, -redact-regexp: exit %d\n%s", code, out)
	}
	out, _, code = cli(t, bin, append(env, "IDEMKIT_REDACT_FIELDS=customer", "IDEMKIT_REDACT_REGEXP=amount"),
		"dlq", "inspect", "-topic", dead, "-id", "pay-1")
	if code != 0 || strings.Contains(out, "ada@example.com") || strings.Contains(out, `"amount"`) {
		t.Fatalf("IDEMKIT_REDACT_FIELDS, IDEMKIT_REDACT_REGEXP: exit %d\n%s", code, out)
	}

	// Asked for: verbatim.
	out, _, code = cli(t, bin, env, "dlq", "inspect", "-topic", dead, "-id", "pay-1", "-show-payload")
	if code != 0 || !strings.Contains(out, card) || !strings.Contains(out, cardSpaced) || !strings.Contains(out, bearer) ||
		strings.Contains(out, "redacted") {
		t.Fatalf("-show-payload: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{
		{"-show-payload", "-redact"},
		{"-redact-regexp", "("},
	} {
		_, errOut, code := cli(t, bin, env, append([]string{"dlq", "inspect", "-topic", dead, "-id", "pay-1"}, args...)...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2 (%q)", args, code, errOut)
		}
	}
}

// TestRedactorText: card-like digit runs keep their last four digits;
// shorter runs (order numbers, amounts) are left alone, and so are longer
// ones without a card number inside.
func TestRedactorText(t *testing.T) {
	r := &redactor{}
	for in, want := range map[string]string{
		"pan 4111111111111111 end": "pan ************1111 end",
		"4111-1111-1111-1111":      "****-****-****-1111",
		"order 123456 amount 12":   "order 123456 amount 12",
		// Longer than a card number: only a Luhn-valid stretch of 13 to 19
		// digits starting with 2 to 6 inside it counts as one.
		"id 1111111111111111111111111": "id 1111111111111111111111111",
		"id 0004111111111111111100":    "id 000************1111100",
	} {
		if got := r.text(in); got != want {
			t.Errorf("text(%q) = %q, want %q", in, got, want)
		}
	}
	if got := r.bytes([]byte{0xff, 0xfe}); got != "(2 bytes, not UTF-8)" {
		t.Errorf("bytes(binary) = %q", got)
	}
}

// TestCLIParked: a NonBlocking consumer parks key B behind a failing head,
// with an hour before its next attempt, while key A flows. consumer parked
// list shows the head and the messages behind it (text, -json, redacted);
// retry without a key is bad usage; retry of a key not parked fails and
// changes nothing; -dry-run changes nothing (the key stays parked); retry
// -key B makes the head due and the running consumer releases B's messages
// in order, each once, without waiting the hour.
func TestCLIParked(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	topic := testenv.NewTopic(t, 1)
	group := testenv.Name(t, "g")
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t)}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("effects")+` (id text PRIMARY KEY, seq bigserial)`); err != nil {
		t.Fatal(err)
	}
	var recs []kafka.Record
	for _, m := range [][2]string{{"b1", "B"}, {"a1", "A"}, {"b2", "B"}, {"a2", "A"}, {"b3", "B"}} {
		recs = append(recs, kafka.Record{Key: kafka.NewBytes([]byte(m[1])), Value: kafka.NewBytes([]byte(`{"cvv":"123"}`)),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(m[0])}}})
	}
	testenv.Produce(t, topic, 0, recs...)

	var healed atomic.Bool
	var mu sync.Mutex
	seen := map[string]bool{}
	flowed, released := make(chan struct{}), make(chan struct{})
	var flowOnce, releaseOnce sync.Once
	r, err := consumer.New(db.Pool, &consumer.Config{Kafka: testenv.Kafka(t), Topic: topic, GroupID: group, Store: store,
		BatchSize: 1, FailureMode: consumer.NonBlocking, Retry: retry.Policy{MaxAttempts: 1},
		ParkedRetry: retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxAttempts: 5},
		ParkedPoll:  20 * time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID == "b1" && !healed.Load() {
				return errors.New("ledger down for card " + card)
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` (id) VALUES ($1)`, m.ID)
			return err
		}),
		Observers: []consumer.Observer{&testobs.Hooks{OnOutcome: func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			switch o {
			case consumer.Parked:
				seen["parked "+m.ID] = true
			case consumer.Applied:
				seen[m.ID] = true
			}
			if seen["a2"] && seen["parked b3"] { // b3 comes after a2: wait for both
				flowOnce.Do(func() { close(flowed) })
			}
			if seen["b3"] {
				releaseOnce.Do(func() { close(released) })
			}
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-flowed:
	case <-time.After(60 * time.Second):
		t.Fatal("key A did not flow past parked key B")
	}

	common := []string{"-topic", topic, "-group", group, "-schema", db.Schema}
	parked := func() []consumer.ParkedMessage {
		t.Helper()
		list, err := consumer.ListParked(ctx, db.Pool, store, consumer.ParkedQuery{Consumer: group, Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		return list
	}
	before := parked()
	if len(before) != 3 {
		t.Fatalf("%d parked, want 3", len(before))
	}

	out, errOut, code := cli(t, bin, env, append([]string{"consumer", "parked", "list"}, common...)...)
	if code != 0 || !strings.Contains(out, "head, 2 behind") || strings.Count(out, "behind its head") != 2 ||
		!strings.Contains(out, "ledger down for card ************1111") || strings.Contains(out, card) ||
		!strings.Contains(out, "3 parked message(s) of 1 key(s)") {
		t.Fatalf("parked list: exit %d %s\n%s", code, errOut, out)
	}
	out, _, code = cli(t, bin, env, append([]string{"consumer", "parked", "list", "-json"}, common...)...)
	var list struct {
		Consumer string       `json:"consumer"`
		Parked   []parkedJSON `json:"parked"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Parked) != 3 || list.Consumer != group {
		t.Fatalf("parked list -json: exit %d, %v\n%s", code, err, out)
	}
	if p := list.Parked[0]; p.MessageID != "b1" || !p.Head || p.Behind != 2 || p.Attempts != 1 || p.Key != "B" ||
		p.Value == nil || *p.Value != `{"cvv":"***"}` || strings.Contains(out, card) {
		t.Fatalf("parked list -json head: %+v\n%s", p, out)
	}

	// Refusals change nothing.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "-key K"},
		{[]string{"-all", "-key", "B"}, 2, "exclude"},
		{[]string{"-key", "nosuch"}, 1, "no parked message"},
		{[]string{"-key", "B", "-name", "other"}, 2, "differ"},
	} {
		out, errOut, code := cli(t, bin, env, append(append([]string{"consumer", "parked", "retry"}, common...), tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("retry %q: exit %d, want %d with %q\nstdout %q\nstderr %q", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
	out, errOut, code = cli(t, bin, env, append([]string{"consumer", "parked", "retry", "-key", "B", "-dry-run"}, common...)...)
	if code != 0 || !strings.Contains(out, "dry run, nothing changed: would make 1 key(s) due now") {
		t.Fatalf("retry -dry-run: exit %d %s\n%s", code, errOut, out)
	}
	if after := parked(); len(after) != 3 || !after[0].NextAttempt.Equal(before[0].NextAttempt) {
		t.Fatalf("the dry run or a refusal changed the parked messages: %+v", after)
	}
	select {
	case <-released:
		t.Fatal("key B was released before the retry")
	case <-time.After(200 * time.Millisecond): // ten ParkedPolls
	}

	healed.Store(true)
	out, errOut, code = cli(t, bin, env, append([]string{"consumer", "parked", "retry", "-key", "B", "-json"}, common...)...)
	var res struct {
		MadeDue int          `json:"made_due"`
		Heads   []parkedJSON `json:"heads"`
	}
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res.MadeDue != 1 || len(res.Heads) != 1 ||
		res.Heads[0].MessageID != "b1" || res.Heads[0].Behind != 2 {
		t.Fatalf("retry -json: exit %d, %v %s\n%s", code, err, errOut, out)
	}
	select {
	case <-released:
	case <-time.After(60 * time.Second):
		t.Fatal("key B was not released after idemkit consumer parked retry")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the cleanup
	rows, err := db.Pool.Query(ctx, `SELECT id FROM `+db.Table("effects")+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var b []string
	for _, id := range ids {
		if id[0] == 'b' {
			b = append(b, id)
		}
	}
	if !slices.Equal(b, []string{"b1", "b2", "b3"}) || len(ids) != 5 {
		t.Fatalf("applied %v; key B in order %v, want [b1 b2 b3], each message once", ids, b)
	}
	if left := parked(); len(left) != 0 {
		t.Fatalf("still parked: %+v", left)
	}
	out, _, code = cli(t, bin, env, append([]string{"consumer", "parked", "list"}, common...)...)
	if code != 0 || !strings.Contains(out, "0 parked message(s)") {
		t.Fatalf("parked list after the release: exit %d\n%s", code, out)
	}
}

// TestCLIJSONListings: every listing's -json is one JSON document on
// stdout that says what the text says.
func TestCLIJSONListings(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t), "IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	schema := []string{"-schema", db.Schema}
	for _, tc := range []struct {
		args  []string
		check func(v any) bool
	}{
		{[]string{"migrate", "status"}, func(v any) bool {
			m := v.(map[string]any)
			return m["schema"] == db.Schema && len(m["applied"].([]any)) == len(migrate.Known()) && len(m["pending"].([]any)) == 0
		}},
		{[]string{"outbox", "stats"}, func(v any) bool { m := v.(map[string]any); return m["backlog"] == 0.0 && m["dead"] == 0.0 }},
		{[]string{"outbox", "dead"}, func(v any) bool { return len(v.([]any)) == 0 }},
		{[]string{"idemhttp", "stuck"}, func(v any) bool { return len(v.([]any)) == 0 }},
		{[]string{"consumer", "parked", "list", "-topic", "t", "-name", "n"}, func(v any) bool {
			return len(v.(map[string]any)["parked"].([]any)) == 0
		}},
	} {
		out, errOut, code := cli(t, bin, env, append(append(tc.args, "-json"), schema...)...)
		var v any
		if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || !tc.check(v) {
			t.Errorf("%q -json: exit %d, %v, stderr %q\n%s", tc.args, code, err, errOut, out)
		}
	}
}

// TestCLIUnmigratedEverywhere: every command that reads idemkit's tables,
// run on a schema never migrated, fails (exit 1) with one line that names
// the schema and says to run idemkit migrate up, without PostgreSQL's
// SQLSTATE.
func TestCLIUnmigratedEverywhere(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t) // never migrated
	topic := testenv.NewTopic(t, 1)
	testenv.CreateTopic(t, topic+dlq.TopicSuffixDefault, 1)
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t), "IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	for _, args := range [][]string{
		{"dedup", "purge", "-older-than", "1h"},
		{"idemhttp", "stuck"},
		{"outbox", "stats"},
		{"outbox", "dead"},
		{"outbox", "retry", "00000000-0000-4000-8000-000000000000"},
		{"consumer", "parked", "list", "-topic", topic, "-name", "n"},
		{"consumer", "parked", "retry", "-topic", topic, "-name", "n", "-all"},
		{"consumer", "positions", "-topic", topic, "-group", "g"},
		{"consumer", "seek", "-topic", topic, "-group", "g", "-to-earliest"},
		{"status"},
	} {
		out, errOut, code := cli(t, bin, env, append(args, "-schema", db.Schema)...)
		if code != 1 || !strings.Contains(errOut, "schema "+db.Schema) || !strings.Contains(errOut, "idemkit migrate up") ||
			strings.Contains(errOut, "SQLSTATE") || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("%q: exit %d, want 1 with one line naming the schema and idemkit migrate up\nstdout: %sstderr: %s",
				args, code, out, errOut)
		}
	}
}
