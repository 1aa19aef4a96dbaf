package outbox

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/idemkit/idemkit/kafkaconn"
)

// kafkaDeliverer publishes a round's rows: every row of the round, whatever
// its topic and partition, goes out in one produce request per partition
// leader (one request in all when one broker leads them), with one record
// batch per partition holding that partition's rows in seq order. kafka-go's
// Writer would send one request per partition, each from a goroutine of its
// own; at a trickle that is most of a round's cost.
//
// Partitions are chosen as kafka.Writer with kafka.Hash does (so a key keeps
// its partition across idemkit versions): the FNV-1a hash of the key modulo
// the partition count; a message without a key goes round-robin.
type kafkaDeliverer struct {
	transport kafka.RoundTripper
	addr      net.Addr
	kafka     *kafkaconn.Config // to name refused credentials and certificates
	maxBytes  int
	timeout   time.Duration
	balancer  kafka.Hash
}

// size over-estimates the bytes Kafka counts for a message.
func size(r *row) int {
	n := 64 + len(r.rec.Key) + len(r.rec.Value) + len(HeaderID) + 36
	for _, h := range r.rec.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

func (k *kafkaDeliverer) cut(rows []*row) int {
	total := 0
	for i, r := range rows {
		s := size(r)
		if s > k.maxBytes {
			continue // rejected alone in deliver
		}
		if total+s > k.maxBytes {
			return i
		}
		total += s
	}
	return len(rows)
}

// deliver publishes rows (in enqueue order) and returns one error per row.
// A partition's record batch is written all or nothing.
func (k *kafkaDeliverer) deliver(ctx context.Context, rows []*row) []error {
	errs := make([]error, len(rows))
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()

	var topics []string
	held := map[int64]bool{}
	for i, r := range rows {
		if held[r.lockKey] {
			errs[i] = errHeld
		} else if s := size(r); s > k.maxBytes {
			errs[i] = fmt.Errorf("%w: about %d bytes, limit %d", ErrMessageTooLarge, s, k.maxBytes)
			held[r.lockKey] = true
		} else if !slices.Contains(topics, r.rec.Topic) {
			topics = append(topics, r.rec.Topic)
		}
	}
	if len(topics) == 0 {
		return errs
	}
	// kafka.Transport answers from its cache (MetadataTTL).
	m, err := k.transport.RoundTrip(ctx, k.addr, &metadataAPI.Request{TopicNames: topics})
	if err != nil {
		return fill(errs, k.kafka.Wrap(err))
	}
	meta := m.(*metadataAPI.Response)

	type part struct {
		topic     string
		partition int32
	}
	type leaderReq struct {
		parts map[part][]int // rows by partition, in order
		order []part
	}
	byLeader := map[int32]*leaderReq{}
	for _, topic := range topics {
		var t *metadataAPI.ResponseTopic
		for i := range meta.Topics {
			if meta.Topics[i].Name == topic {
				t = &meta.Topics[i]
			}
		}
		var terr error
		switch {
		case t == nil:
			terr = kafka.UnknownTopicOrPartition
		case t.ErrorCode != 0:
			terr = kafka.Error(t.ErrorCode)
		case len(t.Partitions) == 0:
			terr = kafka.UnknownTopicOrPartition
		}
		if terr != nil {
			for i, r := range rows {
				if errs[i] == nil && r.rec.Topic == topic {
					errs[i] = terr
				}
			}
			continue
		}
		leaders := make([]int32, len(t.Partitions))
		for _, p := range t.Partitions {
			if int(p.PartitionIndex) < len(leaders) {
				leaders[p.PartitionIndex] = p.LeaderID
			}
		}
		ids := make([]int, len(t.Partitions))
		for i := range ids {
			ids[i] = i
		}
		for i, r := range rows {
			if errs[i] != nil || r.rec.Topic != topic {
				continue
			}
			p := int32(k.balancer.Balance(kafka.Message{Key: r.rec.Key}, ids...))
			leader := leaders[p]
			if leader < 0 {
				errs[i] = kafka.LeaderNotAvailable
				continue
			}
			lr := byLeader[leader]
			if lr == nil {
				lr = &leaderReq{parts: map[part][]int{}}
				byLeader[leader] = lr
			}
			key := part{topic, p}
			if _, ok := lr.parts[key]; !ok {
				lr.order = append(lr.order, key)
			}
			lr.parts[key] = append(lr.parts[key], i)
		}
	}

	now := time.Now()
	send := func(lr *leaderReq) {
		req := &produceAPI.Request{Acks: int16(kafka.RequireAll), Timeout: int32(k.timeout.Milliseconds())}
		for _, key := range lr.order {
			idx := lr.parts[key]
			recs := make([]kafka.Record, len(idx))
			for j, i := range idx {
				r := rows[i]
				hs := make([]kafka.Header, 0, len(r.rec.Headers)+1)
				hs = append(hs, r.rec.Headers...)
				hs = append(hs, kafka.Header{Key: HeaderID, Value: []byte(r.rec.ID)})
				recs[j] = kafka.Record{Time: now, Key: bytesOrNil(r.rec.Key), Value: bytesOrNil(r.rec.Value), Headers: hs}
			}
			ps := produceAPI.RequestPartition{Partition: key.partition,
				RecordSet: protocol.RecordSet{Version: 2, Records: protocol.NewRecordReader(recs...)}}
			if n := len(req.Topics); n > 0 && req.Topics[n-1].Topic == key.topic {
				req.Topics[n-1].Partitions = append(req.Topics[n-1].Partitions, ps)
			} else {
				req.Topics = append(req.Topics, produceAPI.RequestTopic{Topic: key.topic, Partitions: []produceAPI.RequestPartition{ps}})
			}
		}
		resp, err := k.transport.RoundTrip(ctx, k.addr, req)
		if err != nil {
			err = k.kafka.Wrap(err)
			for _, key := range lr.order {
				for _, i := range lr.parts[key] {
					errs[i] = err
				}
			}
			return
		}
		got := map[part]error{}
		for _, t := range resp.(*produceAPI.Response).Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					got[part{t.Topic, p.Partition}] = kafka.Error(p.ErrorCode)
				} else {
					got[part{t.Topic, p.Partition}] = nil
				}
			}
		}
		for _, key := range lr.order {
			perr, ok := got[key]
			if !ok {
				perr = fmt.Errorf("outbox: no produce response for %s/%d", key.topic, key.partition)
			}
			for _, i := range lr.parts[key] {
				errs[i] = perr
			}
		}
	}
	if len(byLeader) == 1 {
		for _, lr := range byLeader {
			send(lr)
		}
		return errs
	}
	var wg sync.WaitGroup
	for _, lr := range byLeader {
		wg.Go(func() { send(lr) })
	}
	wg.Wait()
	return errs
}

func bytesOrNil(b []byte) kafka.Bytes {
	if b == nil {
		return nil
	}
	return kafka.NewBytes(b)
}

// fill sets every unset error to err.
func fill(errs []error, err error) []error {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	return errs
}
