package idemotel

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/retry"
)

// Span attributes of idemkit's own, besides the messaging semantic
// conventions.
const (
	// AttrConsumer is the consumer's dedup name (consumer.Config.Name).
	AttrConsumer = attribute.Key("idemkit.consumer")
	// AttrAttempt is the handler attempt a transaction runs (from 1).
	AttrAttempt = attribute.Key("idemkit.attempt")
	// AttrOutcome is a one-message transaction's outcome once it committed:
	// "applied", "duplicate" or "parked".
	AttrOutcome = attribute.Key("idemkit.outcome")
	// AttrApplied, AttrDuplicate and AttrParked count a batch's outcomes
	// once it committed.
	AttrApplied   = attribute.Key("idemkit.messages.applied")
	AttrDuplicate = attribute.Key("idemkit.messages.duplicate")
	AttrParked    = attribute.Key("idemkit.messages.parked")
	// AttrRetryAttempt, AttrRetryClass and AttrRetryDelay describe, on the
	// EventRetry event, the failed attempt that the span's transaction
	// retries: its number, its error class and the wait before this one.
	AttrRetryAttempt = attribute.Key("idemkit.retry.attempt")
	AttrRetryClass   = attribute.Key("idemkit.retry.class")
	AttrRetryDelay   = attribute.Key("idemkit.retry.delay")
)

// MaxLinks bounds the links of a batch's span: the first MaxLinks messages
// that carry a trace context get one. It is the SDK's default limit
// (sdktrace.SpanLimits.LinkCountLimit), past which the SDK would drop the
// earlier links one by one at a cost that grows with the batch.
const MaxLinks = 128

// EventRetry is the span event that opens the span of a transaction run
// again after a handler failure (a consumer.RetryEvent): it carries the failed
// attempt's number, class, delay and error message (AttrRetryAttempt,
// AttrRetryClass, AttrRetryDelay, "exception.message"). The failed attempt's
// own span ended with that error.
const EventRetry = "idemkit.retry"

// Consumer is the telemetry of one consumer, made by Telemetry.Consumer.
type Consumer struct {
	t        *Telemetry
	name     string
	topic    string
	opPrefix string // the runner's outage op prefix: "consumer <group>/<topic>: "

	spanName  string
	spanAttrs []attribute.KeyValue // the same for every transaction
	hasFields func(headers []kafka.Header) bool

	base         attrOpts // consumer, topic
	consumerOnly attrOpts // consumer
	outcomes     [consumer.Parked + 1]attrOpts
	classes      map[retry.Class]attrOpts
	beyond       map[bool]attrOpts // by applied, for the beyond-horizon counter
	commit       attrOpts          // consumer, topic, result
	rollback     attrOpts

	retryMu sync.Mutex
	retries map[int]retryNote // by partition: the failure its next transaction retries

	mu         sync.Mutex // guards reg and runner
	reg        metric.Registration
	runner     *consumer.Runner // the one Observe watches
	partMu     sync.Mutex
	partitions map[int]attrOpts // consumer, topic, partition
}

// retryNote is a failure a RetryEvent reported, waiting for the span of
// the transaction that retries it.
type retryNote struct {
	offset  int64
	attempt int
	class   retry.Class
	delay   time.Duration
	err     string
}

// Consumer wires the telemetry into cfg, which must name its Topic, its
// GroupID (or Name) and its Handler or BatchHandler: call it after filling
// cfg and before consumer.New(pool, cfg). It adds to what cfg already has:
//
//   - An observer, first in cfg.Observers, whose TxStart and TxEnd open
//     and end a span per transaction (see the package documentation):
//     the span is in the context of the claim, the handlers, the other
//     observers and the other events of that transaction.
//     Its Outcome, Retry, Rebalanced, OffsetCommit and outage events count
//     into the consumer's metrics.
//   - A Middleware (or BatchMiddleware, with a BatchHandler), appended last
//     so that it is the innermost, times each handler call.
//
// The counters of the consumer's label sets start at zero here, so that
// alert rules see their first increase. Gauges need the runner: call
// Observe once consumer.New returned it. To count dead letters, set
// cfg.OnFailure to DeadLetters(w) before consumer.New. Call Consumer once per
// configuration: a second call would wire everything in twice.
func (t *Telemetry) Consumer(cfg *consumer.Config) (*Consumer, error) {
	switch {
	case cfg == nil:
		return nil, fmt.Errorf("%w: nil consumer config", ErrInvalidConfig)
	case cfg.Topic == "":
		return nil, fmt.Errorf("%w: consumer Topic is empty", ErrInvalidConfig)
	case cfg.Name == "" && cfg.GroupID == "":
		return nil, fmt.Errorf("%w: consumer GroupID and Name are empty", ErrInvalidConfig)
	case cfg.Handler == nil && cfg.BatchHandler == nil:
		return nil, fmt.Errorf("%w: set the consumer's Handler or BatchHandler before wiring telemetry into it", ErrInvalidConfig)
	}
	name := cmp.Or(cfg.Name, cfg.GroupID)
	c := &Consumer{
		t:        t,
		name:     name,
		topic:    cfg.Topic,
		opPrefix: "consumer " + cfg.GroupID + "/" + cfg.Topic + ": ",
		spanName: "process " + cfg.Topic,
		spanAttrs: []attribute.KeyValue{
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(cfg.Topic),
			semconv.MessagingConsumerGroupName(cfg.GroupID),
			AttrConsumer.String(name),
		},
		hasFields:    headerFilter(t.prop.Fields()),
		base:         attrs(keyConsumer, name, keyTopic, cfg.Topic),
		consumerOnly: attrs(keyConsumer, name),
		commit:       attrs(keyConsumer, name, keyTopic, cfg.Topic, keyResult, "commit"),
		rollback:     attrs(keyConsumer, name, keyTopic, cfg.Topic, keyResult, "rollback"),
		classes:      map[retry.Class]attrOpts{},
		beyond:       map[bool]attrOpts{},
		retries:      map[int]retryNote{},
		partitions:   map[int]attrOpts{},
	}
	in := &t.consumer
	ctx := context.Background()
	for _, o := range []consumer.Outcome{consumer.Applied, consumer.Duplicate, consumer.Failed, consumer.Parked} {
		c.outcomes[o] = attrs(keyConsumer, name, keyTopic, cfg.Topic, keyOutcome, o.String())
		in.messages.Add(ctx, 0, c.outcomes[o].add...)
	}
	for _, cl := range []retry.Class{retry.ClassTransient, retry.ClassPermanent, 0} {
		c.classes[cl] = attrs(keyConsumer, name, keyTopic, cfg.Topic, keyClass, classLabel(cl))
		in.retries.Add(ctx, 0, c.classes[cl].add...)
	}
	in.rebalances.Add(ctx, 0, c.consumerOnly.add...)
	in.commitFailures.Add(ctx, 0, c.consumerOnly.add...)
	if cfg.Retention > 0 {
		for _, action := range []string{"failed", "applied"} {
			c.beyond[action == "applied"] = attrs(keyConsumer, name, keyTopic, cfg.Topic, keyAction, action)
			in.beyondHorizon.Add(ctx, 0, c.beyond[action == "applied"].add...)
		}
	}
	in.outageActive.Add(ctx, 0, c.consumerOnly.add...)

	// First, so that the span encloses what the other observers see; a new
	// slice, so that one shared with another config is not written into.
	cfg.Observers = append([]consumer.Observer{observer{c}}, cfg.Observers...)
	// Clipped, so that a middleware slice shared with another config is
	// copied, not written into.
	if cfg.Handler != nil {
		cfg.Middleware = append(slices.Clip(cfg.Middleware), c.middleware)
	} else {
		cfg.BatchMiddleware = append(slices.Clip(cfg.BatchMiddleware), c.batchMiddleware)
	}
	return c, nil
}

// attrOpts are the options that give a measurement one attribute set, as
// the variadic arguments of Add, Record and Observe: built once, so that hot
// paths allocate neither the set nor the slice.
type attrOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
	obs []metric.ObserveOption
}

// attrs returns the attrOpts of key, value pairs.
func attrs(kv ...string) attrOpts {
	a := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		a = append(a, attribute.String(kv[i], kv[i+1]))
	}
	o := metric.WithAttributeSet(attribute.NewSet(a...))
	return attrOpts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}, obs: []metric.ObserveOption{o}}
}

// classLabel is a retry class as the class label has it: "transient",
// "permanent" or "unknown".
func classLabel(c retry.Class) string {
	switch c {
	case retry.ClassTransient, retry.ClassPermanent:
		return c.String()
	}
	return "unknown"
}

// observer is the consumer's observer: its methods are not part of
// Consumer's API.
type observer struct{ c *Consumer }

func (o observer) TxStart(ctx context.Context, e *consumer.TxStartEvent) context.Context {
	return o.c.txStart(ctx, e.Messages, e.Attempt)
}

func (o observer) TxEnd(ctx context.Context, e *consumer.TxEndEvent) {
	if e.LockWait > 0 {
		o.c.t.consumer.lockWait.Record(ctx, e.LockWait.Seconds(), o.c.base.rec...)
	}
	o.c.txEnd(ctx, e.Messages, e.Outcomes, e.Err, e.Duration)
}

func (o observer) Outcome(ctx context.Context, e *consumer.OutcomeEvent) {
	c := o.c
	in := &c.t.consumer
	if oc := e.Outcome; oc >= consumer.Applied && oc <= consumer.Parked {
		in.messages.Add(ctx, 1, c.outcomes[oc].add...)
	} else {
		in.messages.Add(ctx, 1, attrs(keyConsumer, c.name, keyTopic, c.topic, keyOutcome, oc.String()).add...)
	}
	if e.Horizon != nil {
		in.beyondHorizon.Add(ctx, 1, c.beyond[e.Outcome == consumer.Applied].add...)
	}
}

func (o observer) Retry(ctx context.Context, e *consumer.RetryEvent) {
	c := o.c
	opt, ok := c.classes[e.Class]
	if !ok {
		opt = c.classes[0]
	}
	c.t.consumer.retries.Add(ctx, 1, opt.add...)
	note := retryNote{offset: e.Message.Offset, attempt: e.Attempt, class: e.Class, delay: e.Delay}
	if e.Err != nil {
		note.err = e.Err.Error()
	}
	c.retryMu.Lock()
	c.retries[e.Message.Partition] = note
	c.retryMu.Unlock()
}

func (o observer) Rebalanced(ctx context.Context, _ *consumer.RebalanceEvent) {
	o.c.t.consumer.rebalances.Add(ctx, 1, o.c.consumerOnly.add...)
}

func (o observer) OffsetCommit(ctx context.Context, e *consumer.OffsetCommitEvent) {
	if e.Err != nil {
		o.c.t.consumer.commitFailures.Add(ctx, 1, o.c.consumerOnly.add...)
	}
}

func (o observer) OutageStarted(ctx context.Context, e *consumer.OutageEvent) {
	c := o.c
	c.t.consumer.outages.Add(ctx, 1, attrs(keyConsumer, c.name, keyOp, c.opLabel(e.Op)).add...)
	c.t.consumer.outageActive.Add(ctx, 1, c.consumerOnly.add...)
}

func (o observer) OutageEnded(ctx context.Context, _ *consumer.OutageEvent) {
	o.c.t.consumer.outageActive.Add(ctx, -1, o.c.consumerOnly.add...)
}

// opLabel is an outage op without what the labels already say (the
// runner's "consumer <group>/<topic>: " prefix) and without a partition
// number, so that the label has few values and names the server:
// "postgres schema", "kafka consumer group", "postgres partition", "kafka
// fetch partition".
func (c *Consumer) opLabel(op string) string {
	op = strings.TrimPrefix(op, c.opPrefix)
	if i := strings.LastIndexByte(op, ' '); i > 0 {
		if _, err := strconv.Atoi(op[i+1:]); err == nil {
			op = op[:i]
		}
	}
	return op
}

// txKey is the context key of a transaction's span: TxEnd finds it there
// even when an observer after ours put another span in the context.
type txKey struct{}

func (c *Consumer) txStart(ctx context.Context, msgs []*consumer.Message, attempt int) context.Context {
	if len(msgs) == 0 || c.t.noTraces {
		return ctx
	}
	first := msgs[0]
	attributes := make([]attribute.KeyValue, 0, len(c.spanAttrs)+4)
	attributes = append(attributes, c.spanAttrs...)
	attributes = append(attributes, semconv.MessagingDestinationPartitionID(strconv.Itoa(first.Partition)),
		AttrAttempt.Int(attempt))
	opts := make([]trace.SpanStartOption, 0, 3)
	opts = append(opts, trace.WithSpanKind(trace.SpanKindConsumer))
	parent := ctx
	if len(msgs) == 1 {
		// One message: its span continues the producer's trace, and the
		// handler sees the message's baggage.
		attributes = append(attributes, semconv.MessagingMessageID(first.ID), semconv.MessagingKafkaOffset(int(first.Offset)))
		if c.hasFields(first.Headers) {
			parent = c.t.Extract(ctx, first.Headers)
		}
	} else {
		// A batch: one span, linked to each message's trace.
		attributes = append(attributes, semconv.MessagingBatchMessageCount(len(msgs)))
		var links []trace.Link
		for _, m := range msgs {
			if len(links) == MaxLinks {
				break
			}
			if !c.hasFields(m.Headers) {
				continue
			}
			if sc := trace.SpanContextFromContext(c.t.Extract(context.Background(), m.Headers)); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
					semconv.MessagingMessageID(m.ID), semconv.MessagingKafkaOffset(int(m.Offset))}})
			}
		}
		if len(links) > 0 {
			opts = append(opts, trace.WithLinks(links...))
		}
	}
	opts = append(opts, trace.WithAttributes(attributes...))
	ctx, span := c.t.tracer.Start(parent, c.spanName, opts...)
	if attempt > 1 {
		c.retryMu.Lock()
		note, ok := c.retries[first.Partition]
		if ok && note.offset == first.Offset {
			delete(c.retries, first.Partition)
		}
		c.retryMu.Unlock()
		if ok && note.offset == first.Offset && span.IsRecording() {
			span.AddEvent(EventRetry, trace.WithAttributes(AttrRetryAttempt.Int(note.attempt),
				AttrRetryClass.String(classLabel(note.class)), AttrRetryDelay.String(note.delay.String()),
				semconv.ExceptionMessage(note.err)))
		}
	}
	return context.WithValue(ctx, txKey{}, span)
}

func (c *Consumer) txEnd(ctx context.Context, msgs []*consumer.Message, outcomes []consumer.Outcome, err error, d time.Duration) {
	in := &c.t.consumer
	result := c.commit
	if err != nil {
		result = c.rollback
	}
	in.txDuration.Record(ctx, d.Seconds(), result.rec...)
	in.batchMessages.Record(ctx, int64(len(msgs)), c.base.rec...)
	span, ok := ctx.Value(txKey{}).(trace.Span)
	if !ok {
		return
	}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case len(outcomes) == 1:
		span.SetAttributes(AttrOutcome.String(outcomes[0].String()))
	default:
		var applied, duplicate, parked int
		for _, o := range outcomes {
			switch o {
			case consumer.Applied:
				applied++
			case consumer.Duplicate:
				duplicate++
			case consumer.Parked:
				parked++
			}
		}
		span.SetAttributes(AttrApplied.Int(applied), AttrDuplicate.Int(duplicate), AttrParked.Int(parked))
	}
	span.End()
}

func (c *Consumer) middleware(next consumer.Handler) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		start := time.Now()
		err := next.Handle(ctx, tx, msg)
		c.t.consumer.handlerDuration.Record(ctx, time.Since(start).Seconds(), c.base.rec...)
		return err
	})
}

func (c *Consumer) batchMiddleware(next consumer.BatchHandler) consumer.BatchHandler {
	return consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		start := time.Now()
		err := next.HandleBatch(ctx, tx, msgs)
		c.t.consumer.handlerDuration.Record(ctx, time.Since(start).Seconds(), c.base.rec...)
		return err
	})
}

// DeadLetters returns w.OnFailure counting each message it wrote
// (idemkit_dlq_writes_total, labelled with the consumer, the origin topic
// and the dead-letter topic it went to: w.Route's choice). Every
// destination of the consumer's topic (w.Topics) starts at zero. Set it as
// the consumer's Config.OnFailure, before consumer.New. A write that failed
// is not counted here: the consumer keeps the message; DeadLetterWriter
// counts the failures.
func (c *Consumer) DeadLetters(w *dlq.Writer) consumer.FailureFunc {
	type key struct{ topic, dlqTopic string }
	var mu sync.Mutex
	opts := map[key]attrOpts{}
	get := func(topic, dlqTopic string) attrOpts {
		mu.Lock()
		defer mu.Unlock()
		k := key{topic, dlqTopic}
		o, ok := opts[k]
		if !ok {
			o = attrs(keyConsumer, c.name, keyTopic, topic, keyDLQTopic, dlqTopic)
			opts[k] = o
		}
		return o
	}
	for _, t := range w.Topics(c.topic) {
		c.t.dlq.writes.Add(context.Background(), 0, get(c.topic, t).add...)
	}
	return func(ctx context.Context, msg *consumer.Message, err error) error {
		if werr := w.OnFailure(ctx, msg, err); werr != nil {
			return werr
		}
		c.t.dlq.writes.Add(ctx, 1, get(msg.Topic, w.Route(msg, err)).add...)
		return nil
	}
}

// DeadLetterWriter wires the telemetry into cfg before dlq.NewWriter(cfg):
// it chains cfg.WriteFailed (the function cfg already had runs after) so
// that each failed attempt to write a dead letter counts into
// idemkit_dead_letter_write_failures_total, labelled with the consumer, the
// failed message's topic and the dead-letter topic. The counter starts at 0
// for the consumer's topic, so that an alert on its increase sees the first
// failure.
func (c *Consumer) DeadLetterWriter(cfg *dlq.WriterConfig) error {
	if cfg == nil {
		return fmt.Errorf("%w: nil writer config", ErrInvalidConfig)
	}
	dlqTopic := func(topic string) string { return cmp.Or(cfg.Topic, topic+dlq.TopicSuffixDefault) }
	own := attrs(keyConsumer, c.name, keyTopic, c.topic, keyDLQTopic, dlqTopic(c.topic))
	c.t.dlq.writeFailures.Add(context.Background(), 0, own.add...)
	prev := cfg.WriteFailed
	cfg.WriteFailed = func(ctx context.Context, f *dlq.WriteFailure) {
		opt := own
		if f.Topic != c.topic || f.DLQTopic != dlqTopic(c.topic) {
			opt = attrs(keyConsumer, c.name, keyTopic, f.Topic, keyDLQTopic, f.DLQTopic)
		}
		c.t.dlq.writeFailures.Add(ctx, 1, opt.add...)
		if prev != nil {
			prev(ctx, f)
		}
	}
	return nil
}

// headerFilter returns a function that tells whether headers hold one of
// fields (a propagator's header names): a message without them is not run
// through the propagator at all.
func headerFilter(fields []string) func(headers []kafka.Header) bool {
	return func(headers []kafka.Header) bool {
		for _, h := range headers {
			for _, f := range fields {
				if h.Key == f {
					return true
				}
			}
		}
		return false
	}
}
