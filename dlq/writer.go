package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/pgtext"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
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
	// dropped. The zero Policy means no bound on attempts or time, 100ms to
	// 10s apart.
	Retry retry.Policy
	// MaxOutage bounds how long OnFailure waits while Kafka cannot be
	// reached (see retry.IsConnection): it backs off, logs the outage once
	// when it starts and once with its duration when it ends, and returns a
	// *retry.OutageError (errors.Is retry.ErrOutage) once the outage lasted
	// longer, checked between two tries. The consumer then stops with that
	// error, the message kept. Defaults to 0: wait for ever.
	MaxOutage time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// Pool, when set, is where a dead letter too large for its topic keeps
	// the original value: in the table Tables.DLQValues of Schema (see
	// package migrate), while the letter carries the original key and
	// headers, the dead-letter headers and a reference (HeaderValueStored).
	// The Reprocessor, LoadValue and idemkit dlq inspect and replay load it
	// back, byte for byte. A letter is too large when it exceeds the
	// dead-letter topic's max.message.bytes (read from the broker, cached a
	// minute, lowered when the broker refuses a letter) or the writer's
	// own limit (64 MiB); its failure history is first cut to the first and
	// the last rounds. Without Pool such a letter cannot be written:
	// OnFailure tries it again under Retry, logging each attempt at ERROR,
	// until the topic's max.message.bytes is raised. Defaults to nil.
	Pool *pgxpool.Pool
	// Tables says where Pool's table lives (migrate.Tables; the zero
	// value: schema "public", every default name).
	Tables migrate.Tables
	// WriteFailed, when set, runs after each failed attempt to write a dead
	// letter, whether the writer tries again or gives up (outages it waits
	// out are logged as outages and not reported here). Each failure is also
	// logged at ERROR. Defaults to nil.
	WriteFailed func(ctx context.Context, f *WriteFailure)
}

// WriteFailure is a failed attempt to write a dead letter (see
// WriterConfig.WriteFailed).
type WriteFailure struct {
	// DLQTopic is the topic written to: the dead-letter topic (or, for a
	// Reprocessor's Republish, the origin topic).
	DLQTopic string
	// Topic, Partition, Offset and MessageID are the failed message's: the
	// consumer's record, or the dead letter a Reprocessor writes back.
	Topic     string
	Partition int
	Offset    int64
	MessageID string
	// Attempt counts the attempts to write this letter, from 1.
	Attempt int
	// Final is true when the writer gives up: OnFailure returns the error,
	// and the consumer keeps the message (its position does not move).
	Final bool
	// Err is the attempt's error.
	Err error
}

// writerLimit is the largest message the writer's kafka.Writer accepts
// (its BatchBytes; each batch holds one message, so that two letters never
// add up to more than their topic takes). Topics take less: see limit.
const writerLimit = 64 << 20

// fallbackLimit is the limit letters are checked against when a topic's
// max.message.bytes cannot be read: Kafka's default.
const fallbackLimit = 1048588

// limitTTL is how long a topic's max.message.bytes is cached.
const limitTTL = time.Minute

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
	client    *kafka.Client // reads topics' max.message.bytes
	values    *valueStore   // nil without Pool

	mu     sync.Mutex
	limits map[string]topicLimit
}

// topicLimit is a topic's max.message.bytes and when it was read.
type topicLimit struct {
	bytes int64
	at    time.Time
}

// ErrInvalidConfig is wrapped by configuration errors.
var ErrInvalidConfig = fmt.Errorf("dlq: %w", idemkit.ErrInvalidConfig)

// NewWriter validates cfg and returns a Writer. Close it when done.
func NewWriter(cfg *WriterConfig) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newWriter(cfg)
}

// Validate reports what NewWriter would refuse in c: a missing or
// contradictory field, a value out of range, a table name that is not one.
// The error wraps ErrInvalidConfig.
func (c *WriterConfig) Validate() error {
	if c == nil {
		return fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if err := dedup.ValidateID("Group or Consumer", cmp.Or(c.Consumer, c.Group)); err != nil {
		// The reprocessor replays a letter under this name: without one
		// it could not look up or claim anything.
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	_, err := c.withDefaults()
	return err
}

// withDefaults checks c, except for the names a Reprocessor's own writer
// takes from each letter, and returns it with its defaults applied.
func (c *WriterConfig) withDefaults() (WriterConfig, error) {
	if c == nil {
		return WriterConfig{}, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if err := c.Kafka.Validate(); err != nil {
		return WriterConfig{}, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	if c.MaxOutage < 0 {
		return WriterConfig{}, fmt.Errorf("%w: MaxOutage must not be negative", ErrInvalidConfig)
	}
	for i, r := range c.Routes {
		if r.Topic == "" || r.Match == nil {
			return WriterConfig{}, fmt.Errorf("%w: Routes[%d] needs a Topic and a Match", ErrInvalidConfig, i)
		}
	}
	w := *c
	w.Routes = slices.Clone(w.Routes)
	w.Consumer = cmp.Or(w.Consumer, w.Group)
	if reflect.ValueOf(w.Retry).IsZero() {
		w.Retry = retry.Policy{MaxAttempts: -1, MaxElapsedTime: -1}
	}
	if err := w.Retry.Validate(); err != nil {
		return WriterConfig{}, fmt.Errorf("%w: Retry: %v", ErrInvalidConfig, err)
	}
	if w.Pool != nil {
		if err := w.Tables.Validate(); err != nil {
			return WriterConfig{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if w.Logger == nil {
		w.Logger = slog.Default()
	}
	return w, nil
}

// newWriter is NewWriter for the reprocessor's own writer, which writes
// letters back under the names they carry.
func newWriter(cfg *WriterConfig) (*Writer, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	transport, err := c.Kafka.Transport()
	if err != nil {
		return nil, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	var values *valueStore
	if c.Pool != nil {
		if values, err = newValueStore(c.Tables); err != nil {
			return nil, err
		}
	}
	return &Writer{cfg: c, transport: transport, values: values, limits: map[string]topicLimit{},
		client: &kafka.Client{Addr: c.Kafka.Addr(), Timeout: scanTimeout, Transport: transport},
		w: &kafka.Writer{
			Addr:         c.Kafka.Addr(),
			Balancer:     &kafka.Hash{},
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond,
			BatchSize:    1,
			BatchBytes:   writerLimit,
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
	dl := &letter{topic: w.route(msg, merr), orig: msg.Message, origin: origin, group: w.cfg.Group,
		name: w.cfg.Consumer, id: msg.ID, history: extend(history, f),
		src: source{topic: msg.Topic, partition: msg.Partition, offset: msg.Offset, id: msg.ID}}
	kafkaWait := &outage.Waiter{Op: "write to " + dl.topic + ": kafka", Log: w.cfg.Logger, Max: w.cfg.MaxOutage}
	pgWait := &outage.Waiter{Op: "store dead-letter value for " + dl.topic + ": postgres", Log: w.cfg.Logger, Max: w.cfg.MaxOutage,
		Bound: pgsession.Timeout(valueWriteBudget)}
	return w.writeLetter(ctx, dl, kafkaWait, pgWait)
}

// extend returns history with f appended as its next round.
func extend(history []Failure, f Failure) []Failure {
	f.Round = len(history)
	if len(history) > 0 {
		f.Round = history[len(history)-1].Round + 1 // a cut history keeps its rounds' numbers
	}
	return append(slices.Clip(history), f)
}

// letter is a dead letter to write: where it goes, what it is made of, and
// the message it is about (for logs and WriteFailed).
type letter struct {
	topic           string
	orig            kafka.Message
	origin          Origin
	group, name, id string
	history         []Failure // the last is the current round
	src             source
}

// source is the coordinates of the message a write is about.
type source struct {
	topic     string
	partition int
	offset    int64
	id        string
}

// valueWriteBudget is what storing a dead letter's value may take, past
// which (plus pgsession.Margin) a silent connection is given up on.
const valueWriteBudget = 30 * time.Second

// writeLetter writes dl in the first form that fits its topic.
func (w *Writer) writeLetter(ctx context.Context, dl *letter, kafkaWait, pgWait *outage.Waiter) error {
	return w.write(ctx, dl.topic, dl.src, kafkaWait, func(ctx context.Context) (kafka.Message, error) {
		return w.fit(ctx, dl, pgWait)
	})
}

// fit builds dl whole when it fits its topic; else with its history cut to
// the first and the last rounds; else with its value stored in PostgreSQL
// and a reference in its place. It returns a *TooLargeError when no form
// fits.
func (w *Writer) fit(ctx context.Context, dl *letter, pgWait *outage.Waiter) (kafka.Message, error) {
	limit := w.limit(ctx, dl.topic)
	history := dl.history
	m := build(dl.orig, dl.origin, dl.group, dl.name, dl.id, history, nil)
	if n := size(&m); n > limit && len(history) > 2 {
		history = []Failure{history[0], history[len(history)-1]}
		m = build(dl.orig, dl.origin, dl.group, dl.name, dl.id, history, nil)
	}
	n := size(&m)
	if n <= limit {
		return m, nil
	}
	if len(dl.orig.Value) > 0 && w.values != nil {
		var ref ValueRef
		err := pgWait.Do(ctx, func(ctx context.Context) error {
			var err error
			ref, err = w.values.put(ctx, w.cfg.Pool, dl.name, dl.origin, dl.orig.Value)
			return err
		})
		if err != nil {
			return kafka.Message{}, err
		}
		m = build(dl.orig, dl.origin, dl.group, dl.name, dl.id, history, &ref)
		if n = size(&m); n <= limit {
			return m, nil
		}
	}
	// Read the limit again at the next attempt: it may have been raised.
	w.mu.Lock()
	delete(w.limits, dl.topic)
	w.mu.Unlock()
	return kafka.Message{}, &TooLargeError{Topic: dl.topic, Size: n, Limit: limit, Stored: w.values != nil}
}

// TooLargeError is a dead letter that fits its topic in no form: the
// writer tries it again under its Retry policy (the topic's limit is read
// again), logging each attempt. It matches kafka.MessageSizeTooLarge.
type TooLargeError struct {
	Topic       string
	Size, Limit int64 // the letter's size as estimated, and the topic's limit
	// Stored is true when the value was already stored apart (the key and
	// headers alone are too large).
	Stored bool
}

func (e *TooLargeError) Error() string {
	fix := "set WriterConfig.Pool to keep large values in PostgreSQL, or raise the topic's max.message.bytes"
	if e.Stored {
		fix = "its key and headers alone are too large: raise the topic's max.message.bytes"
	}
	return fmt.Sprintf("dead letter of about %d bytes does not fit %s (limit %d bytes): %s", e.Size, e.Topic, e.Limit, fix)
}

func (e *TooLargeError) Unwrap() error { return kafka.MessageSizeTooLarge }

// size bounds the bytes m takes in a record batch of its own: the batch
// header (61 bytes), the record's fields and varint lengths, and per header
// its two lengths.
func size(m *kafka.Message) int64 {
	n := int64(61 + 40 + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(10 + len(h.Key) + len(h.Value))
	}
	return n
}

// limit returns the largest letter topic takes: the lesser of the writer's
// limit and the topic's max.message.bytes, read from the broker and cached
// (Kafka's default when the broker does not say); a letter the broker
// refuses all the same lowers the cached limit (see refused).
func (w *Writer) limit(ctx context.Context, topic string) int64 {
	w.mu.Lock()
	l, ok := w.limits[topic]
	w.mu.Unlock()
	if ok && time.Since(l.at) < limitTTL {
		return min(writerLimit, l.bytes)
	}
	n, err := w.topicLimit(ctx, topic)
	if err != nil {
		// Kept like a limit read (logged once a minute): a letter it lets
		// through that the broker refuses all the same lowers it.
		w.cfg.Logger.Warn("cannot read the dead-letter topic's max.message.bytes; letters are checked against Kafka's default",
			"dlq_topic", topic, "limit", fallbackLimit, "err", err)
		n = fallbackLimit
	}
	w.mu.Lock()
	w.limits[topic] = topicLimit{bytes: n, at: time.Now()}
	w.mu.Unlock()
	return min(writerLimit, n)
}

// refused records that topic's broker refused a letter of n bytes as too
// large.
func (w *Writer) refused(topic string, n int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l, ok := w.limits[topic]
	if !ok || time.Since(l.at) >= limitTTL || l.bytes >= n {
		l.bytes = n - 1
	}
	l.at = time.Now()
	w.limits[topic] = l
}

// topicLimit reads topic's max.message.bytes from the cluster.
func (w *Writer) topicLimit(ctx context.Context, topic string) (int64, error) {
	resp, err := w.client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"max.message.bytes"},
	}}})
	if err != nil {
		return 0, w.cfg.Kafka.Wrap(err)
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return 0, r.Error
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "max.message.bytes" {
				n, err := strconv.ParseInt(e.ConfigValue, 10, 64)
				if err != nil || n <= 0 {
					return 0, fmt.Errorf("max.message.bytes %q", e.ConfigValue)
				}
				return n, nil
			}
		}
	}
	return 0, errors.New("max.message.bytes not in the answer")
}

// write writes the message next makes (again at each attempt), waiting out
// Kafka outages with wait and retrying other failures under the writer's
// policy. A letter too large for its topic is retried (next makes it
// smaller once the limit is known). Each failure other than an outage is
// logged at ERROR with src's coordinates and reported to WriteFailed.
func (w *Writer) write(ctx context.Context, topic string, src source, wait *outage.Waiter,
	next func(ctx context.Context) (kafka.Message, error)) error {
	schedule := w.cfg.Retry.Schedule()
	for attempt := 1; ; attempt++ {
		m, err := next(ctx)
		if err == nil {
			m.Topic = topic
			err = w.w.WriteMessages(ctx, m)
			var werrs kafka.WriteErrors
			if errors.As(err, &werrs) && len(werrs) == 1 {
				err = werrs[0]
			}
			if errors.Is(err, kafka.MessageSizeTooLarge) {
				w.refused(topic, size(&m))
			}
		}
		if err == nil {
			wait.Ok()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("dlq: write to %s: %w", topic, ctx.Err())
		}
		if kafkaconn.Classify(err) != nil {
			// Refused credentials or certificates: no retry helps, and the
			// message stays where it is (the consumer keeps its position).
			err = w.cfg.Kafka.Wrap(err)
			w.failed(ctx, topic, src, attempt, true, err)
			return fmt.Errorf("dlq: write to %s: %w", topic, err)
		}
		var oerr *retry.OutageError
		if errors.As(err, &oerr) {
			w.failed(ctx, topic, src, attempt, true, err) // storing the value outlasted MaxOutage
			return fmt.Errorf("dlq: %w", err)
		}
		if retry.IsConnection(err) {
			if werr := wait.Wait(ctx, err); werr != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("dlq: write to %s: %w", topic, werr)
				}
				w.failed(ctx, topic, src, attempt, true, werr)
				return fmt.Errorf("dlq: %w", werr) // its Op names the topic
			}
			continue
		}
		wait.Ok() // Kafka answered
		if errors.Is(err, kafka.UnknownTopicOrPartition) {
			// Kafka calls this retriable; for us it means the topic was not
			// created. Keep waiting, but say what to do.
			if w.cfg.Topic != "" && topic != w.cfg.Topic { // a Reprocessor's write to an origin topic
				err = fmt.Errorf("topic %q does not exist: %w", topic, err)
			} else {
				err = fmt.Errorf("dead-letter topic %q does not exist (create it: idemkit topic create, or kafkaconn.CreateTopic): %w", topic, err)
			}
		}
		class := w.cfg.Retry.Classify(err)
		if errors.Is(err, kafka.MessageSizeTooLarge) {
			// Not the letter's fault, and no reason to stop: the next
			// attempt makes it fit the limit the broker showed, or waits for
			// the topic's limit to be raised.
			class = retry.ClassTransient
		}
		var delay time.Duration
		ok := false
		if class == retry.ClassTransient {
			delay, ok = schedule.Next()
		}
		w.failed(ctx, topic, src, attempt, !ok, err)
		if !ok {
			return fmt.Errorf("dlq: write to %s: %w", topic, &retry.Error{Err: err, Attempts: attempt, Class: class})
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("dlq: write to %s: %w", topic, ctx.Err())
		case <-t.C:
		}
	}
}

// failed logs a failed attempt to write a letter about src and reports it
// to WriteFailed.
func (w *Writer) failed(ctx context.Context, topic string, src source, attempt int, final bool, err error) {
	msg := "dead-letter write failed; the message waits and is tried again"
	if final {
		msg = "dead-letter write failed; giving up: the message stays where it is"
	}
	w.cfg.Logger.ErrorContext(ctx, msg, "dlq_topic", topic, "topic", src.topic, "partition", src.partition,
		"offset", src.offset, "message_id", src.id, "attempt", attempt, "err", err)
	if h := w.cfg.WriteFailed; h != nil {
		h(ctx, &WriteFailure{DLQTopic: topic, Topic: src.topic, Partition: src.partition, Offset: src.offset,
			MessageID: src.id, Attempt: attempt, Final: final, Err: err})
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
// failure history, whose last entry is the current round. Its error text
// goes in HeaderError only (Parse puts it back). With ref the value is left
// out and the letter references the stored one.
func build(orig kafka.Message, o Origin, group, name, id string, history []Failure, ref *ValueRef) kafka.Message {
	f := history[len(history)-1]
	history = slices.Clone(history)
	history[len(history)-1].Error = ""
	hist, _ := json.Marshal(history)
	headers := make([]kafka.Header, 0, len(orig.Headers)+15)
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
	value := orig.Value
	if ref != nil {
		add(HeaderValueStored, ref.String())
		value = nil
	}
	return kafka.Message{Key: orig.Key, Value: value, Headers: headers}
}
