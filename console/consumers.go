package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
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
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	Key       string `json:"key"`
	// KeyID names the key in a retry form: an HMAC of it, never its bytes.
	KeyID       string     `json:"key_id"`
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
		row := parkedRow{Partition: p.Partition, Offset: p.Offset, Key: c.red.Bytes(p.Key), KeyID: c.parkedKeyID(name, topic, p.Partition, p.Key),
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

// parkedKeyID is the opaque handle of a parked key in a retry form: an
// HMAC of the consumer, topic, partition and key under the console's
// secret. A page shows a key redacted; its raw bytes (even in hex) would
// undo the redaction, so they never leave the server.
func (c *Console) parkedKeyID(name, topic string, partition int, key []byte) string {
	m := hmac.New(sha256.New, c.forms.secret)
	m.Write([]byte("idemkit-console-parked-key\x00"))
	for _, s := range []string{name, topic, strconv.Itoa(partition)} {
		m.Write([]byte(s))
		m.Write([]byte{0})
	}
	m.Write(key)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:parkedKeyIDLen])
}

const parkedKeyIDLen = 16

// parkedKey finds the parked key of partition whose handle is id, among
// the keys parked there.
func (c *Console) parkedKey(ctx context.Context, name, topic string, partition int, id string) ([]byte, error) {
	want, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(want) != parkedKeyIDLen {
		return nil, badf("key_id: not a parked key's handle")
	}
	list, err := consumer.ListParked(ctx, c.pool, c.dedup, consumer.ParkedQuery{Consumer: name, Topic: topic,
		Partitions: []int{partition}, Limit: parkedResolveLimit})
	if err != nil {
		return nil, err
	}
	for _, p := range list {
		if p.Head && hmac.Equal([]byte(c.parkedKeyID(name, topic, partition, p.Key)), []byte(id)) {
			return p.Key, nil
		}
	}
	return nil, fmt.Errorf("%w: no parked key of partition %d has that handle (released meanwhile?)", errNotFound, partition)
}

// parkedResolveLimit bounds the parked messages of a partition read to
// find a key by its handle.
const parkedResolveLimit = 10 * parkedListLimit

// parkedRetry makes parked keys due now (consumer.RetryParked): one key
// (partition and key_id, its handle), or every key (all=1), once per form.
// The audit target names the key redacted, as the page shows it.
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
		p, err := strconv.Atoi(r.PostFormValue("partition"))
		if err != nil || p < 0 {
			c.fail(w, r, rq, http.StatusBadRequest, "retry parked: partition: want a whole number")
			return
		}
		k, err := c.parkedKey(ctx, name, topic, p, r.PostFormValue("key_id"))
		if err != nil {
			c.failErr(w, r, rq, "retry parked", err)
			return
		}
		q.Partitions, q.Keys = []int{p}, [][]byte{k}
		target = fmt.Sprintf("consumer %s on %s: partition %d key %s", name, topic, p, c.red.Bytes(k))
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
