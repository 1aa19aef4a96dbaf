package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/pgtext"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/retry"
)

// Headers a dead letter carries besides the original message's own.
const (
	HeaderOriginTopic       = "idemkit-dlq-origin-topic"
	HeaderOriginPartition   = "idemkit-dlq-origin-partition"
	HeaderOriginOffset      = "idemkit-dlq-origin-offset"
	HeaderOriginIncarnation = "idemkit-dlq-origin-incarnation" // consumer.Message.Incarnation; absent means 0
	HeaderOriginTime        = "idemkit-dlq-origin-time"        // the message's record timestamp, RFC 3339; absent when it had none
	HeaderGroup             = "idemkit-dlq-group"
	HeaderConsumer          = "idemkit-dlq-consumer" // the dedup name: replays use the same scope
	HeaderMessageID         = "idemkit-dlq-message-id"
	HeaderError             = "idemkit-dlq-error"
	HeaderErrorClass        = "idemkit-dlq-error-class"
	HeaderAttempts          = "idemkit-dlq-attempts"
	HeaderFirstFailure      = "idemkit-dlq-first-failure" // RFC 3339, nanoseconds
	HeaderLastFailure       = "idemkit-dlq-last-failure"
	HeaderReplayRound       = "idemkit-dlq-replay-round" // 0 for the first dead-lettering
	HeaderHistory           = "idemkit-dlq-history"      // JSON array of Failure, oldest first
)

// HeaderLineage is the header a republished message carries (see Republish):
// its dead letter's origin, consumer and failure history as JSON, so that a
// Writer that dead-letters it again extends that history instead of starting
// a new one. Writers of other consumers, and of other topics, ignore it.
const HeaderLineage = "idemkit-dlq-lineage"

// TopicSuffixDefault makes the default dead-letter topic name: "<topic>.dlq".
const TopicSuffixDefault = ".dlq"

// maxErrorText bounds the error text carried in headers.
const maxErrorText = 4096

// Failure is one round of failures in a dead letter's history.
type Failure struct {
	Round        int       `json:"round"`
	Error        string    `json:"error"`
	Class        string    `json:"class"`
	Attempts     int       `json:"attempts"`
	FirstFailure time.Time `json:"first_failure"`
	LastFailure  time.Time `json:"last_failure"`
}

// WriterConfig configures a Writer. Kafka.Brokers is required.
type WriterConfig struct {
	// Kafka is how to reach the cluster: its brokers, TLS and SASL (see
	// package kafkaconn). The writer makes its transport from it and closes
	// it in Close.
	Kafka kafkaconn.Config
	// Topic is the dead-letter topic of the failures no Route matches.
	// Defaults to the origin topic with ".dlq" appended. It must exist: the
	// writer never creates it (see CreateTopic).
	Topic string
	// Routes send failures to dead-letter topics by error: the first Route
	// whose Match reports true chooses the topic; a failure none matches
	// goes to Topic. Each topic must exist. Defaults to none.
	Routes []Route
	// Group and Consumer are recorded in the headers: the consumer group and
	// the dedup name of the consumer that gave up. Consumer defaults to Group.
	Group, Consumer string
	// Retry paces attempts to write while the dead-letter topic is
	// unavailable for another reason than an outage (for example because it
	// does not exist). The partition waits meanwhile: a message is never
	// dropped. Defaults to no bound on attempts or time, 100ms to 10s apart.
	Retry *retry.Policy
	// MaxOutage bounds how long OnFailure waits while Kafka cannot be
	// reached (see retry.IsConnection): it backs off, logs the outage once
	// when it starts and once with its duration when it ends, and returns a
	// *retry.OutageError (errors.Is retry.ErrOutage) once the outage lasted
	// longer, checked between two tries. The consumer then stops with that
	// error, the message kept. Defaults to 0: wait for ever.
	MaxOutage time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Route sends the failures it matches to a dead-letter topic of their own
// (see WriterConfig.Routes), e.g. validation errors to "orders.invalid".
type Route struct {
	// Topic is the dead-letter topic.
	Topic string
	// Match reports whether a failure goes to Topic. err is a
	// *consumer.MessageError wrapping the handler's error (errors.Is and
	// errors.As see through it). Match must not block; a Match that panics
	// counts as no match (logged).
	Match func(msg *consumer.Message, err error) bool
}

// RouteErrors is a Route to topic for the failures whose error matches one
// of targets (errors.Is).
func RouteErrors(topic string, targets ...error) Route {
	return Route{Topic: topic, Match: func(_ *consumer.Message, err error) bool {
		return slices.ContainsFunc(targets, func(t error) bool { return errors.Is(err, t) })
	}}
}

// Writer publishes messages that failed for good to a dead-letter topic, with
// their origin and failure history in headers, acknowledged by all in-sync
// replicas. Its OnFailure method is a consumer.FailureFunc.
type Writer struct {
	cfg       WriterConfig
	w         *kafka.Writer
	transport *kafka.Transport
}

// ErrInvalidConfig is wrapped by configuration errors.
var ErrInvalidConfig = fmt.Errorf("dlq: %w", idemkit.ErrInvalidConfig)

// NewWriter validates cfg and returns a Writer. Close it when done.
func NewWriter(cfg *WriterConfig) (*Writer, error) {
	if cfg != nil {
		if err := dedup.ValidateID("Group or Consumer", cmp.Or(cfg.Consumer, cfg.Group)); err != nil {
			// The reprocessor replays a letter under this name: without one
			// it could not look up or claim anything.
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return newWriter(cfg)
}

// newWriter is NewWriter for the reprocessor's own writer, which writes
// letters back under the names they carry.
func newWriter(cfg *WriterConfig) (*Writer, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	transport, err := cfg.Kafka.Transport() // validates cfg.Kafka
	if err != nil {
		return nil, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	if cfg.MaxOutage < 0 {
		return nil, fmt.Errorf("%w: MaxOutage must not be negative", ErrInvalidConfig)
	}
	for i, r := range cfg.Routes {
		if r.Topic == "" || r.Match == nil {
			return nil, fmt.Errorf("%w: Routes[%d] needs a Topic and a Match", ErrInvalidConfig, i)
		}
	}
	c := *cfg
	c.Routes = slices.Clone(c.Routes)
	c.Consumer = cmp.Or(c.Consumer, c.Group)
	if c.Retry == nil {
		c.Retry = &retry.Policy{MaxAttempts: -1, MaxElapsedTime: -1}
	}
	if err := c.Retry.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Writer{cfg: c, transport: transport, w: &kafka.Writer{
		Addr:         c.Kafka.Addr(),
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		// A few quick tries for a leader that moves; longer trouble is
		// ours to wait out (outages) or retry (Retry), and to log.
		MaxAttempts: 3,
		Transport:   transport,
	}}, nil
}

// Close flushes and closes the underlying Kafka writer and its connections.
func (w *Writer) Close() error {
	err := w.w.Close()
	w.transport.CloseIdleConnections()
	return err
}

// TopicFor returns the dead-letter topic for messages from origin that no
// Route matches.
func (w *Writer) TopicFor(origin string) string {
	return cmp.Or(w.cfg.Topic, origin+TopicSuffixDefault)
}

// Topics returns every dead-letter topic messages from origin may go to:
// the Routes' topics, in order, then TopicFor(origin), each once. List them
// all to see, count or replay every destination (dlq.ListConfig.Topics,
// `idemkit dlq list -topic a,b`).
func (w *Writer) Topics(origin string) []string {
	var out []string
	for _, r := range w.cfg.Routes {
		if !slices.Contains(out, r.Topic) {
			out = append(out, r.Topic)
		}
	}
	if t := w.TopicFor(origin); !slices.Contains(out, t) {
		out = append(out, t)
	}
	return out
}

// Route returns the dead-letter topic OnFailure writes msg to for err:
// the first Route that matches, else TopicFor(msg.Topic). It is a
// ReprocessorConfig.Destination.
func (w *Writer) Route(msg *consumer.Message, err error) string {
	var merr *consumer.MessageError
	if !errors.As(err, &merr) {
		merr = &consumer.MessageError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, ID: msg.ID,
			Attempts: 1, Class: retry.Classify(err), Err: err}
	}
	return w.route(msg, merr)
}

// route is Route for a *consumer.MessageError.
func (w *Writer) route(msg *consumer.Message, err *consumer.MessageError) string {
	for i, r := range w.cfg.Routes {
		if w.match(r, i, msg, err) {
			return r.Topic
		}
	}
	return w.TopicFor(msg.Topic)
}

// match is r.Match, a panic counting as no match.
func (w *Writer) match(r Route, i int, msg *consumer.Message, err error) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			w.cfg.Logger.Error("dead-letter route panicked; trying the next one", "route", i, "topic", r.Topic,
				"message_id", msg.ID, "panic", fmt.Sprint(v))
			ok = false
		}
	}()
	return r.Match(msg, err)
}

// OnFailure writes msg to the dead-letter topic and returns nil once the
// write is acknowledged. While Kafka cannot be reached it waits the outage
// out (see MaxOutage); while the topic is unavailable for another reason it
// retries under the writer's policy; the consumer's partition waits either
// way. It returns an error only when ctx ends, the policy gives up or the
// outage outlasts MaxOutage: the consumer then keeps the message (its
// position does not move).
//
// A message that a Reprocessor republished carries its lineage (see
// HeaderLineage): its dead letter keeps the first dead letter's origin and
// extends its history by one round, so that ReplayLimit bounds the loop.
func (w *Writer) OnFailure(ctx context.Context, msg *consumer.Message, err error) error {
	var merr *consumer.MessageError
	if !errors.As(err, &merr) {
		now := time.Now()
		merr = &consumer.MessageError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset,
			ID: msg.ID, Attempts: 1, Class: retry.Classify(err), FirstFailure: now, LastFailure: now, Err: err}
	}
	f := Failure{Error: pgtext.Text(merr.Err.Error(), maxErrorText), Class: merr.Class.String(), Attempts: merr.Attempts,
		FirstFailure: merr.FirstFailure.UTC(), LastFailure: merr.LastFailure.UTC()}
	origin := Origin{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, Incarnation: msg.Incarnation,
		Time: msg.Time.UTC()}
	var history []Failure
	if lin, err := readLineage(msg.Headers); err != nil {
		w.cfg.Logger.Warn("republished message with an unreadable lineage header; dead-lettering it as a first failure",
			"topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "message_id", msg.ID, "err", err)
	} else if lin != nil && lin.Origin.Topic == msg.Topic && lin.Consumer == w.cfg.Consumer {
		origin, history = lin.Origin, lin.History
	}
	dl := build(msg.Message, origin, w.cfg.Group, w.cfg.Consumer, msg.ID, history, f)
	dl.Topic = w.route(msg, merr)
	wait := &outage.Waiter{Op: "write to " + dl.Topic + ": kafka", Log: w.cfg.Logger, Max: w.cfg.MaxOutage}
	return w.write(ctx, dl, wait)
}

// write writes m, waiting out outages with wait and retrying other failures
// under the writer's policy.
func (w *Writer) write(ctx context.Context, m kafka.Message, wait *outage.Waiter) error {
	schedule := w.cfg.Retry.Schedule()
	for attempt := 1; ; attempt++ {
		err := w.w.WriteMessages(ctx, m)
		var werrs kafka.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == 1 {
			err = werrs[0]
		}
		if err == nil {
			wait.Ok()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("dlq: write to %s: %w", m.Topic, ctx.Err())
		}
		if kafkaconn.Classify(err) != nil {
			// Refused credentials or certificates: no retry helps, and the
			// message stays where it is (the consumer keeps its position).
			return fmt.Errorf("dlq: write to %s: %w", m.Topic, w.cfg.Kafka.Wrap(err))
		}
		if retry.IsConnection(err) {
			if werr := wait.Wait(ctx, err); werr != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("dlq: write to %s: %w", m.Topic, werr)
				}
				return fmt.Errorf("dlq: %w", werr) // its Op names the topic
			}
			continue
		}
		wait.Ok() // Kafka answered
		if errors.Is(err, kafka.UnknownTopicOrPartition) {
			// Kafka calls this retriable; for us it means the topic was not
			// created. Keep waiting, but say what to do.
			err = fmt.Errorf("dead-letter topic %q does not exist (create it, e.g. with dlq.CreateTopic): %w", m.Topic, err)
		}
		class := w.cfg.Retry.Classify(err)
		var delay time.Duration
		ok := false
		if class == retry.ClassTransient {
			delay, ok = schedule.Next()
		}
		if !ok {
			return fmt.Errorf("dlq: write to %s: %w", m.Topic, &retry.Error{Err: err, Attempts: attempt, Class: class})
		}
		w.cfg.Logger.Error("dead-letter write failed; the partition waits", "dlq_topic", m.Topic,
			"attempt", attempt, "retry_in", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("dlq: write to %s: %w", m.Topic, ctx.Err())
		case <-t.C:
		}
	}
}

// Origin is where a dead letter came from: the coordinates of the message
// when it was first dead-lettered (a republished message that fails again
// keeps them).
type Origin struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	// Incarnation is the topic's incarnation (see consumer.Message): offsets
	// of two incarnations of a topic are unrelated.
	Incarnation int64 `json:"incarnation"`
	// Time is the message's record timestamp, zero when it had none: what
	// the dedup horizon is measured against (see ReprocessorConfig.Retention).
	Time time.Time `json:"time,omitzero"`
}

// lineage is what a republished message carries in HeaderLineage.
type lineage struct {
	Origin   Origin    `json:"origin"`
	Consumer string    `json:"consumer"`
	History  []Failure `json:"history"`
}

// readLineage returns the lineage in headers, nil when there is none.
func readLineage(headers []kafka.Header) (*lineage, error) {
	for _, h := range headers {
		if h.Key != HeaderLineage {
			continue
		}
		var l lineage
		if err := json.Unmarshal(h.Value, &l); err != nil {
			return nil, fmt.Errorf("header %s: %w", HeaderLineage, err)
		}
		o := l.Origin
		if o.Topic == "" || o.Partition < 0 || o.Offset < 0 || o.Incarnation < 0 || len(l.History) == 0 {
			return nil, fmt.Errorf("header %s: incomplete: %s", HeaderLineage, h.Value)
		}
		return &l, nil
	}
	return nil, nil
}

// build makes a dead letter of the original message: its key, value and
// headers (without any earlier dead-letter headers), plus the origin and the
// failure history extended by f.
func build(orig kafka.Message, o Origin, group, name, id string, history []Failure, f Failure) kafka.Message {
	f.Round = len(history)
	history = append(history, f)
	hist, _ := json.Marshal(history)
	headers := make([]kafka.Header, 0, len(orig.Headers)+14)
	for _, h := range orig.Headers {
		if !strings.HasPrefix(h.Key, "idemkit-dlq-") {
			headers = append(headers, h)
		}
	}
	add := func(k, v string) { headers = append(headers, kafka.Header{Key: k, Value: []byte(v)}) }
	add(HeaderOriginTopic, o.Topic)
	add(HeaderOriginPartition, strconv.Itoa(o.Partition))
	add(HeaderOriginOffset, strconv.FormatInt(o.Offset, 10))
	add(HeaderOriginIncarnation, strconv.FormatInt(o.Incarnation, 10))
	if !o.Time.IsZero() {
		add(HeaderOriginTime, o.Time.Format(time.RFC3339Nano))
	}
	add(HeaderGroup, group)
	add(HeaderConsumer, name)
	add(HeaderMessageID, id)
	add(HeaderError, f.Error)
	add(HeaderErrorClass, f.Class)
	add(HeaderAttempts, strconv.Itoa(f.Attempts))
	add(HeaderFirstFailure, f.FirstFailure.Format(time.RFC3339Nano))
	add(HeaderLastFailure, f.LastFailure.Format(time.RFC3339Nano))
	add(HeaderReplayRound, strconv.Itoa(f.Round))
	add(HeaderHistory, string(hist))
	return kafka.Message{Key: orig.Key, Value: orig.Value, Headers: headers}
}

// CreateTopic creates a dead-letter topic, with replication factor
// replicas (-1: the broker's default), connecting as kc says. An existing
// topic is not an error.
func CreateTopic(ctx context.Context, kc kafkaconn.Config, topic string, partitions, replicas int) error {
	client, closeClient, err := newClient(&kc)
	if err != nil {
		return err
	}
	defer closeClient()
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: replicas,
	}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("dlq: create topic %s: %w", topic, kc.Wrap(err))
	}
	return nil
}
