package console

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
)

// consumersData is the consumers page: the overview's consumers.
type consumersData struct {
	Consumers []consumerSummary `json:"consumers"`
	Notes     []string          `json:"notes"`
}

func (c *Console) consumersPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	snap, err := c.monitor.Collect(ctx, c.pool)
	if snap == nil {
		c.failErr(w, r, rq, "read the consumers", err)
		return
	}
	d := &consumersData{Consumers: []consumerSummary{}, Notes: append([]string{}, snap.Notes...)}
	if err != nil {
		d.Notes = append(d.Notes, "partly read: "+err.Error())
	}
	o := &overviewData{}
	for _, cs := range snap.Consumers {
		s := consumerSummary{Consumer: cs.Name, Topic: cs.Topic, Partitions: []partitionSummary{}, Lag: cs.Lag,
			Parked: cs.Parked, OldestParkedAgeSeconds: seconds(cs.OldestParkedAge), OldestRecordAgeSeconds: seconds(cs.OldestRecordAge)}
		for _, p := range cs.Partitions {
			s.Partitions = append(s.Partitions, partitionSummary{Partition: p.Partition, Position: p.Position,
				StableEnd: p.StableEnd, Lag: p.Lag, Note: p.Note})
		}
		o.Consumers = append(o.Consumers, s)
	}
	c.check(o)
	d.Consumers = append(d.Consumers, o.Consumers...)
	c.render(w, rq, http.StatusOK, "consumers", "Consumers", d)
}

// consumerData is one consumer's page: its positions per partition in
// PostgreSQL and Kafka, and its parked keys.
type consumerData struct {
	Consumer   string            `json:"consumer"`
	Topic      string            `json:"topic"`
	Partitions []partitionDetail `json:"partitions"`
	Parked     []parkedRow       `json:"parked"`
	// ParkedLimited is true when more parked messages exist than listed.
	ParkedLimited bool       `json:"parked_limited"`
	Notes         []string   `json:"notes"`
	Seek          string     `json:"seek_command"`
	Result        *actResult `json:"result,omitempty"`
}

type partitionDetail struct {
	Partition int    `json:"partition"`
	Position  *int64 `json:"position"`
	Committed *int64 `json:"committed"`
	LogStart  *int64 `json:"log_start"`
	LogEnd    *int64 `json:"log_end"`
	StableEnd *int64 `json:"stable_end"`
	Lag       *int64 `json:"lag"`
	Note      string `json:"note,omitempty"`
}

type parkedRow struct {
	Partition   int        `json:"partition"`
	Offset      int64      `json:"offset"`
	Key         string     `json:"key"`
	KeyHex      string     `json:"key_hex"`
	MessageID   string     `json:"message_id"`
	Head        bool       `json:"head"`
	Behind      int        `json:"behind"`
	Attempts    int        `json:"attempts"`
	NextAttempt time.Time  `json:"next_attempt"`
	Due         bool       `json:"due"`
	LastError   string     `json:"last_error"`
	ParkedAt    time.Time  `json:"parked_at"`
	LastFailure *time.Time `json:"last_failure"`
}

// parkedListLimit bounds the parked messages a page lists.
const parkedListLimit = 500

func (c *Console) consumer(ctx context.Context, name, topic string) (*consumerData, error) {
	if err := dedup.ValidateID("consumer name", name); err != nil || topic == "" {
		return nil, badf("not a consumer name and topic: %q on %q", name, topic)
	}
	d := &consumerData{Consumer: name, Topic: topic, Partitions: []partitionDetail{}, Parked: []parkedRow{}, Notes: []string{},
		Seek: fmt.Sprintf("idemkit consumer seek -group %s -topic %s -to-offset N -partitions P -dry-run", shellQuote(name), shellQuote(topic))}
	snap, err := c.monitor.Collect(ctx, c.pool)
	if snap == nil {
		return nil, err
	}
	if err != nil {
		d.Notes = append(d.Notes, "partly read: "+err.Error())
	}
	found := false
	for _, cs := range snap.Consumers {
		if cs.Name != name || cs.Topic != topic {
			continue
		}
		found = true
		for _, p := range cs.Partitions {
			pos := p.Position
			d.Partitions = append(d.Partitions, partitionDetail{Partition: p.Partition, Position: &pos, StableEnd: p.StableEnd,
				Lag: p.Lag, Note: p.Note})
		}
	}
	if !found {
		return nil, fmt.Errorf("%w: no consumer %q on topic %q (it has no position and no parked message)", errNotFound, name, topic)
	}
	// Kafka's side: the log range and the committed offsets of the group
	// named like the consumer (its Config.Name defaults to its group).
	parts := make([]int, len(d.Partitions))
	for i, p := range d.Partitions {
		parts[i] = p.Partition
	}
	if ranges, err := kafkaoffsets.LogRange(ctx, c.client, topic, parts...); err != nil {
		d.Notes = append(d.Notes, "log range: "+c.cfg.Kafka.Wrap(err).Error())
	} else {
		for i := range d.Partitions {
			if rg, ok := ranges[d.Partitions[i].Partition]; ok {
				d.Partitions[i].LogStart, d.Partitions[i].LogEnd = &rg.Start, &rg.End
			}
		}
	}
	if committed, err := kafkaoffsets.Committed(ctx, c.client, name, topic, parts); err != nil {
		d.Notes = append(d.Notes, "committed offsets of group "+name+": "+c.cfg.Kafka.Wrap(err).Error())
	} else {
		for i := range d.Partitions {
			if off, ok := committed[d.Partitions[i].Partition]; ok {
				d.Partitions[i].Committed = &off
			}
		}
		d.Notes = append(d.Notes, "committed offsets are those of the consumer group named "+name+
			" (a consumer's name defaults to its group)")
	}
	list, err := consumer.ListParked(ctx, c.pool, c.dedup, consumer.ParkedQuery{Consumer: name, Topic: topic, Limit: parkedListLimit})
	if err != nil {
		d.Notes = append(d.Notes, "parked messages: "+err.Error())
		return d, nil
	}
	for _, p := range list {
		row := parkedRow{Partition: p.Partition, Offset: p.Offset, Key: c.red.Bytes(p.Key), KeyHex: hex.EncodeToString(p.Key),
			MessageID: p.MessageID, Head: p.Head, Behind: p.Behind, Attempts: p.Attempts, NextAttempt: p.NextAttempt.UTC(),
			Due: p.Due, LastError: c.red.Text(p.LastError), ParkedAt: p.ParkedAt.UTC()}
		if !p.LastFailure.IsZero() {
			t := p.LastFailure.UTC()
			row.LastFailure = &t
		}
		d.Parked = append(d.Parked, row)
	}
	d.ParkedLimited = len(list) >= parkedListLimit
	return d, nil
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (c *Console) consumerPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	d, err := c.consumer(ctx, r.PathValue("name"), r.PathValue("topic"))
	if err != nil {
		c.failErr(w, r, rq, "read the consumer", err)
		return
	}
	c.render(w, rq, http.StatusOK, "consumer", d.Consumer+" on "+d.Topic, d)
}

// parkedRetry makes parked keys due now (consumer.RetryParked): one key
// (key_hex), or every key (all=1), once per form.
func (c *Console) parkedRetry(w http.ResponseWriter, r *http.Request, rq *request, key string) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	name, topic := r.PathValue("name"), r.PathValue("topic")
	if err := dedup.ValidateID("consumer name", name); err != nil {
		c.fail(w, r, rq, http.StatusBadRequest, "retry parked: "+err.Error())
		return
	}
	q := consumer.ParkedQuery{Consumer: name, Topic: topic}
	target := fmt.Sprintf("consumer %s on %s: every parked key", name, topic)
	if r.PostFormValue("all") != "1" {
		k, err := hex.DecodeString(r.PostFormValue("key_hex"))
		if err != nil {
			c.fail(w, r, rq, http.StatusBadRequest, "retry parked: key_hex: not hex")
			return
		}
		q.Keys = [][]byte{k}
		target = fmt.Sprintf("consumer %s on %s: key %x", name, topic, k)
	}
	res, err := c.act(r, rq, key, "consumer.parked.retry", target, func(ctx context.Context) (string, error) {
		heads, err := consumer.RetryParked(ctx, c.pool, c.dedup, q)
		if err != nil {
			return "", err
		}
		if len(heads) == 0 {
			return "", fmt.Errorf("nothing parked there (released meanwhile?): nothing changed")
		}
		made := 0
		for _, h := range heads {
			if h.Before.After(h.NextAttempt) {
				made++
			}
		}
		return fmt.Sprintf("made %d key(s) due now (%d already due): the consumer re-attempts them, in order, within its ParkedPoll",
			made, len(heads)-made), nil
	})
	if err != nil {
		c.failErr(w, r, rq, "audit the retry", err)
		return
	}
	d, err := c.consumer(ctx, name, topic)
	if err != nil {
		c.failErr(w, r, rq, "read the consumer", err)
		return
	}
	d.Result = &res
	c.render(w, rq, http.StatusOK, "consumer", d.Consumer+" on "+d.Topic, d)
}
