package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/migrate"
)

const parkedListHelp = `Lists the messages a consumer parked in its NonBlocking mode
(consumer.ListParked), in partition and offset order: each key's head (the
message that failed, the one the consumer attempts, with its attempts, next
attempt and last error) and the messages of its key parked behind it. It only
reads. Keys and errors are redacted unless -show-payload (see idemkit dlq
inspect -h); -json adds values and headers, redacted the same way.
-name is the consumer's Config.Name, which defaults to its group: -group G is
the same as -name G.`

const parkedRetryHelp = `Makes parked keys due now (consumer.RetryParked): the running consumer
re-attempts each key's head at its next look for due parked messages
(Config.ParkedPoll, 500ms by default) instead of waiting for the time its
ParkedRetry policy gave it, and releases the messages behind it in order once
it succeeds. Use it after the dependency that failed has healed.
It only reschedules: nothing is skipped, removed or run here; the consumer
still releases each key strictly in offset order, through dedup and your
handler. Attempts are kept: a head whose ParkedRetry is used up goes to
OnFailure (the dead-letter topic) if it fails again. A head the consumer is
attempting at that moment keeps the consumer's verdict. No consumer running:
the keys are attempted when one starts.
Name the keys with -key (repeatable; -key-hex for keys that are not text), or
pass -all for every parked key of the consumer on the topic (a dependency
still down gets them all at once). -dry-run runs the same update in a
transaction it rolls back, and prints what it would make due.`

type parkedFlags struct {
	conn
	topic, name, group string
	table              string
	partitions         string
	keys               [][]byte
	all, dryRun, json  bool
	limit              int
	red                redactor
	only               []int
}

// parkedCmd runs `idemkit consumer parked list|retry`.
func parkedCmd(ctx context.Context, cmd *command, args []string, out io.Writer) (err error) {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var f parkedFlags
	f.registerDB(fs)
	fs.StringVar(&f.table, "table", migrate.ParkedMessagesDefault, "parked messages table")
	fs.StringVar(&f.topic, "topic", "", "the topic the consumer consumes (required)")
	fs.StringVar(&f.name, "name", "", "the consumer's name in PostgreSQL, its Config.Name")
	fs.StringVar(&f.group, "group", "", "the consumer's group: the same as -name, which defaults to the group")
	fs.StringVar(&f.partitions, "partitions", "", "only these partitions, e.g. 0,2 (default: all)")
	fs.Func("key", "only this message key (repeatable; a message without a key has the empty key)", func(s string) error {
		f.keys = append(f.keys, []byte(s))
		return nil
	})
	fs.Func("key-hex", "only this message key, in hex (repeatable)", func(s string) error {
		b, err := hexKey(s)
		if err == nil {
			f.keys = append(f.keys, b)
		}
		return err
	})
	fs.BoolVar(&f.json, "json", false, "print JSON")
	if sub == "list" {
		fs.IntVar(&f.limit, "limit", consumer.ParkedListLimitDefault, "most messages to list")
		f.red.register(fs)
	} else {
		fs.BoolVar(&f.all, "all", false, "every parked key of the consumer on the topic")
		fs.BoolVar(&f.dryRun, "dry-run", false, "print what would be made due, change nothing")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("%s takes no arguments, got %q (keys go in -key)", cmd.name, pos)
	}
	if err := f.validate(sub); err != nil {
		return err
	}
	if err := f.red.init(fs); err != nil {
		return err
	}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: f.schema, ParkedMessages: f.table}})
	if err != nil {
		return usagef("%v", err)
	}
	pool, err := connectDB(ctx, f.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer func() { err = f.dbErr(err) }()
	q := consumer.ParkedQuery{Consumer: f.name, Topic: f.topic, Partitions: f.only, Keys: f.keys, Limit: f.limit}
	if sub == "list" {
		list, err := consumer.ListParked(ctx, pool, store, q)
		if err != nil {
			return err
		}
		return f.printList(list, out)
	}
	return f.retry(ctx, pool, store, q, out)
}

func (f *parkedFlags) validate(sub string) error {
	if f.topic == "" {
		return usagef("consumer parked %s needs -topic", sub)
	}
	switch {
	case f.name == "" && f.group == "":
		return usagef("consumer parked %s needs -name (the consumer's Config.Name) or -group", sub)
	case f.name == "":
		f.name = f.group
	case f.group != "" && f.group != f.name:
		return usagef("-name %q and -group %q differ: the parked messages are kept under the name; pass -name only", f.name, f.group)
	}
	if err := dedup.ValidateID("-name", f.name); err != nil {
		return usagef("%v", err)
	}
	if f.partitions != "" {
		for _, s := range strings.Split(f.partitions, ",") {
			p, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || p < 0 {
				return usagef("-partitions: want partition numbers like 0,2, not %q", f.partitions)
			}
			if !slices.Contains(f.only, p) {
				f.only = append(f.only, p)
			}
		}
	}
	switch {
	case sub == "list" && f.limit <= 0:
		return usagef("consumer parked list: -limit must be at least 1, not %d", f.limit)
	case sub == "retry" && f.all && len(f.keys) > 0:
		return usagef("consumer parked retry: -all and -key exclude each other")
	case sub == "retry" && !f.all && len(f.keys) == 0:
		return usagef("consumer parked retry needs the keys to retry (-key K, repeatable) or -all (see idemkit consumer parked list)")
	}
	return nil
}

func hexKey(s string) ([]byte, error) {
	b := make([]byte, len(s)/2)
	if len(s)%2 != 0 {
		return nil, errors.New("odd number of hex digits")
	}
	for i := range b {
		v, err := strconv.ParseUint(s[2*i:2*i+2], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("not hex: %q", s)
		}
		b[i] = byte(v)
	}
	return b, nil
}

// parkedJSON is a parked message as -json prints it.
type parkedJSON struct {
	Partition    int          `json:"partition"`
	Incarnation  int64        `json:"incarnation"`
	Offset       int64        `json:"offset"`
	Key          string       `json:"key"`
	MessageID    string       `json:"message_id"`
	Value        *string      `json:"value,omitempty"`
	Headers      []headerJSON `json:"headers,omitempty"`
	Time         *time.Time   `json:"time"`
	Head         bool         `json:"head"`
	Behind       int          `json:"behind"`
	Attempts     int          `json:"attempts"`
	FirstFailure *time.Time   `json:"first_failure"`
	LastFailure  *time.Time   `json:"last_failure"`
	LastError    string       `json:"last_error"`
	NextAttempt  time.Time    `json:"next_attempt"`
	Due          bool         `json:"due"` // next_attempt has come, by the database's clock
	ParkedAt     time.Time    `json:"parked_at"`
	Before       *time.Time   `json:"next_attempt_before,omitempty"` // retry: when it was due before
}

func when(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return ptr(t.UTC())
}

func (f *parkedFlags) toJSON(p consumer.ParkedMessage, withPayload bool) parkedJSON {
	j := parkedJSON{Partition: p.Partition, Incarnation: p.Incarnation, Offset: p.Offset, Key: f.red.bytes(p.Key),
		MessageID: p.MessageID, Time: when(p.Time), Head: p.Head, Behind: p.Behind, Attempts: p.Attempts,
		FirstFailure: when(p.FirstFailure), LastFailure: when(p.LastFailure), LastError: f.red.text(p.LastError),
		NextAttempt: p.NextAttempt.UTC(), Due: p.Due, ParkedAt: p.ParkedAt.UTC()}
	if withPayload {
		j.Value = ptr(f.red.value(p.Value))
		j.Headers = []headerJSON{}
		for _, h := range p.Headers {
			j.Headers = append(j.Headers, headerJSON{h.Key, f.red.header(h.Key, h.Value)})
		}
	}
	return j
}

func (f *parkedFlags) printList(list []consumer.ParkedMessage, out io.Writer) error {
	if f.json {
		rows := []parkedJSON{}
		for _, p := range list {
			rows = append(rows, f.toJSON(p, true))
		}
		return writeJSON(out, struct {
			Consumer string       `json:"consumer"`
			Topic    string       `json:"topic"`
			Redacted bool         `json:"redacted"`
			Parked   []parkedJSON `json:"parked"`
		}{f.name, f.topic, !f.red.show, rows})
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tOFFSET\tKEY\tMESSAGE ID\tSTATE\tATTEMPTS\tNEXT ATTEMPT\tPARKED\tLAST ERROR")
	keys := map[string]bool{}
	for _, p := range list {
		keys[strconv.Itoa(p.Partition)+"/"+string(p.Key)] = true
		state, next, why := "behind its head", "-", "-"
		if p.Head {
			state, why = fmt.Sprintf("head, %d behind", p.Behind), short(f.red.text(p.LastError), 60)
			next = p.NextAttempt.UTC().Format(time.RFC3339)
			if p.Due { // by the database's clock, the runner's
				next = "due"
			}
		}
		offset := strconv.FormatInt(p.Offset, 10)
		if p.Incarnation > 0 {
			offset = fmt.Sprintf("%d (incarnation %d)", p.Offset, p.Incarnation)
		}
		fmt.Fprintf(tw, "%d\t%s\t%q\t%s\t%s\t%d\t%s\t%s\t%s\n", p.Partition, offset, f.red.bytes(p.Key), p.MessageID, state,
			p.Attempts, next, p.ParkedAt.UTC().Format(time.RFC3339), why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if len(list) == f.limit {
		more = fmt.Sprintf(" (the first %d: -limit shows more)", f.limit)
	}
	fmt.Fprintf(out, "%d parked message(s) of %d key(s)%s for consumer %s on %s\n", len(list), len(keys), more, f.name, f.topic)
	if len(list) > 0 && !f.red.show {
		fmt.Fprintln(out, "(redacted: -show-payload shows keys and errors verbatim)")
	}
	return nil
}

// retry makes the selected heads due, or with -dry-run says which it would.
func (f *parkedFlags) retry(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, store *dedup.Store, q consumer.ParkedQuery, out io.Writer) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	heads, err := consumer.RetryParked(ctx, tx, store, q)
	if err != nil {
		return err
	}
	if len(heads) == 0 {
		what := "any key"
		if len(f.keys) > 0 {
			what = "the keys given"
		}
		return fmt.Errorf("consumer %s has no parked message of %s on topic %s (schema %s): check -name, -topic, -key and -schema "+
			"(idemkit consumer parked list); nothing changed", f.name, what, f.topic, f.schema)
	}
	if !f.dryRun {
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit: %w; nothing changed", err)
		}
	}
	made, already := 0, 0
	for _, h := range heads {
		if h.Before.After(h.NextAttempt) {
			made++
		} else {
			already++
		}
	}
	if f.json {
		rows := []parkedJSON{}
		for _, h := range heads {
			j := f.toJSON(h.ParkedMessage, false)
			j.Before = ptr(h.Before.UTC())
			rows = append(rows, j)
		}
		return writeJSON(out, struct {
			Consumer   string       `json:"consumer"`
			Topic      string       `json:"topic"`
			DryRun     bool         `json:"dry_run"`
			MadeDue    int          `json:"made_due"`
			AlreadyDue int          `json:"already_due"`
			Heads      []parkedJSON `json:"heads"`
		}{f.name, f.topic, f.dryRun, made, already, rows})
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tOFFSET\tKEY\tMESSAGE ID\tBEHIND\tATTEMPTS\tNEXT ATTEMPT")
	for _, h := range heads {
		next := h.Before.UTC().Format(time.RFC3339) + " → now"
		if !h.Before.After(h.NextAttempt) {
			next = "already due"
		}
		fmt.Fprintf(tw, "%d\t%d\t%q\t%s\t%d\t%d\t%s\n", h.Partition, h.Offset, f.red.bytes(h.Key), h.MessageID, h.Behind,
			h.Attempts, next)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if f.dryRun {
		fmt.Fprintf(out, "dry run, nothing changed: would make %d key(s) due now (%d already due)\n", made, already)
		return nil
	}
	fmt.Fprintf(out, "made %d key(s) due now (%d already due): consumer %s re-attempts them, in order, within its ParkedPoll\n",
		made, already, f.name)
	return nil
}
