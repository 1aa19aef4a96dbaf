package dlq

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
)

// DeadLetter is a message read back from a dead-letter topic.
type DeadLetter struct {
	// Message is the dead letter as read: its Topic, Partition and Offset are
	// the dead-letter topic's.
	Message kafka.Message
	// Origin is where the original message was consumed from when it was
	// first dead-lettered.
	Origin Origin
	// Group and Consumer are the consumer group and the dedup name of the
	// consumer that gave up on it.
	Group, Consumer string
	// MessageID is the original message ID: a replay keeps it. It is empty
	// for a message the consumer could not find an ID in (ErrMissingID); see
	// CheckID.
	MessageID string
	// Round is 0 for a message dead-lettered by a consumer, n for one that
	// failed again in its n-th replay.
	Round int
	// History holds the rounds' failures, oldest first: every round's, or,
	// in a letter that would not fit its topic otherwise, the first and the
	// last (their Round fields say which).
	History []Failure
	// StoredValue is set when the original value was too large for the
	// dead-letter topic: it lives in PostgreSQL (see WriterConfig.Pool), and
	// Message.Value is empty until LoadValue fills it in. A Reprocessor
	// loads it by itself.
	StoredValue *ValueRef

	valueLoaded bool
}

// Last returns the most recent failure.
func (d *DeadLetter) Last() Failure { return d.History[len(d.History)-1] }

// ErrNoMessageID means a dead letter carries no usable message ID: the
// consumer dead-lettered the message for consumer.ErrMissingID. Such a dead
// letter cannot be deduplicated in the consumer's scope (see NoMessageID).
var ErrNoMessageID = errors.New("dlq: no message ID")

// CheckID returns nil when MessageID can be claimed in the dedup store, and
// an error matching ErrNoMessageID otherwise.
func (d *DeadLetter) CheckID() error {
	if d.MessageID == "" {
		return ErrNoMessageID
	}
	if err := dedup.ValidateID("message ID", d.MessageID); err != nil {
		return fmt.Errorf("%w: %w", ErrNoMessageID, err)
	}
	// The ID is claimed under the consumer's name: a letter whose name the
	// store refuses cannot be claimed either (and must not stop a replay).
	if err := dedup.ValidateID("consumer name", d.Consumer); err != nil {
		return fmt.Errorf("%w: %w", ErrNoMessageID, err)
	}
	return nil
}

// Original returns the original message: key, value and headers without the
// dead-letter headers, on the origin topic.
func (d *DeadLetter) Original() kafka.Message {
	m := kafka.Message{Topic: d.Origin.Topic, Partition: d.Origin.Partition, Offset: d.Origin.Offset,
		Key: d.Message.Key, Value: d.Message.Value, Time: d.Message.Time}
	for _, h := range d.Message.Headers {
		if !strings.HasPrefix(h.Key, "idemkit-dlq-") {
			m.Headers = append(m.Headers, h)
		}
	}
	return m
}

// ErrNotDeadLetter means a message lacks the headers a Writer adds.
var ErrNotDeadLetter = errors.New("dlq: not an idemkit dead letter")

// Parse reads a dead letter's headers.
func Parse(m kafka.Message) (*DeadLetter, error) {
	h := map[string]string{}
	for _, x := range m.Headers {
		if strings.HasPrefix(x.Key, "idemkit-dlq-") {
			h[x.Key] = string(x.Value)
		}
	}
	bad := func(what string, err error) error {
		return fmt.Errorf("%w: %s/%d/%d: header %s: %v", ErrNotDeadLetter, m.Topic, m.Partition, m.Offset, what, err)
	}
	for _, k := range []string{HeaderOriginTopic, HeaderOriginPartition, HeaderOriginOffset, HeaderMessageID, HeaderHistory} {
		if _, ok := h[k]; !ok {
			return nil, bad(k, errors.New("missing"))
		}
	}
	d := &DeadLetter{Message: m, Group: h[HeaderGroup], Consumer: h[HeaderConsumer], MessageID: h[HeaderMessageID]}
	d.Origin.Topic = h[HeaderOriginTopic]
	var err error
	if d.Origin.Partition, err = strconv.Atoi(h[HeaderOriginPartition]); err != nil {
		return nil, bad(HeaderOriginPartition, err)
	}
	if d.Origin.Offset, err = strconv.ParseInt(h[HeaderOriginOffset], 10, 64); err != nil {
		return nil, bad(HeaderOriginOffset, err)
	}
	if v, ok := h[HeaderOriginIncarnation]; ok { // absent means 0 (see HeaderOriginIncarnation)
		if d.Origin.Incarnation, err = strconv.ParseInt(v, 10, 64); err == nil && d.Origin.Incarnation < 0 {
			err = errors.New("negative")
		}
		if err != nil {
			return nil, bad(HeaderOriginIncarnation, err)
		}
	}
	if v, ok := h[HeaderOriginTime]; ok {
		if d.Origin.Time, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return nil, bad(HeaderOriginTime, err)
		}
	}
	if err := json.Unmarshal([]byte(h[HeaderHistory]), &d.History); err != nil {
		return nil, bad(HeaderHistory, err)
	}
	if len(d.History) == 0 {
		return nil, bad(HeaderHistory, errors.New("empty"))
	}
	if last := &d.History[len(d.History)-1]; last.Error == "" {
		last.Error = h[HeaderError] // the writer keeps the last error in its own header only
	}
	if v, ok := h[HeaderValueStored]; ok {
		ref, err := parseValueRef(v)
		if err != nil {
			return nil, bad(HeaderValueStored, err)
		}
		d.StoredValue = &ref
	}
	d.Round = d.Last().Round
	return d, nil
}

// Filter selects dead letters; a zero field selects everything.
type Filter struct {
	MessageIDs    []string  // one of these message IDs
	OriginTopic   string    // from this origin topic
	ErrorContains string    // the last error's text contains this
	Class         string    // the last failure's error class is this
	Since, Until  time.Time // the last failure happened in [Since, Until)
}

// Match reports whether d passes the filter.
func (f Filter) Match(d *DeadLetter) bool {
	last := d.Last()
	switch {
	case len(f.MessageIDs) > 0 && !slices.Contains(f.MessageIDs, d.MessageID):
		return false
	case f.OriginTopic != "" && d.Origin.Topic != f.OriginTopic:
		return false
	case f.ErrorContains != "" && !strings.Contains(last.Error, f.ErrorContains):
		return false
	case f.Class != "" && last.Class != f.Class:
		return false
	case !f.Since.IsZero() && last.LastFailure.Before(f.Since):
		return false
	case !f.Until.IsZero() && !last.LastFailure.Before(f.Until):
		return false
	}
	return true
}
