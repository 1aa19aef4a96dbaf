package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// kafka-go has no DeleteRecords call: these are the request and response of
// the Kafka protocol's DeleteRecords API, versions 0 and 1, registered with
// kafka-go's protocol package the first time DeleteRecords runs.

type deleteRecordsRequest struct {
	Topics    []deleteRecordsTopic `kafka:"min=v0,max=v1"`
	TimeoutMs int32                `kafka:"min=v0,max=v1"`
}

type deleteRecordsTopic struct {
	Name       string                   `kafka:"min=v0,max=v1"`
	Partitions []deleteRecordsPartition `kafka:"min=v0,max=v1"`
}

type deleteRecordsPartition struct {
	PartitionIndex int32 `kafka:"min=v0,max=v1"`
	Offset         int64 `kafka:"min=v0,max=v1"`
}

func (r *deleteRecordsRequest) ApiKey() protocol.ApiKey { return protocol.DeleteRecords }

// Broker sends the request to the partition's leader, as Kafka requires.
func (r *deleteRecordsRequest) Broker(cluster protocol.Cluster) (protocol.Broker, error) {
	t, p := r.Topics[0].Name, r.Topics[0].Partitions[0].PartitionIndex
	for _, part := range cluster.Topics[t].Partitions {
		if part.ID == p {
			return cluster.Brokers[part.Leader], nil
		}
	}
	return protocol.Broker{}, fmt.Errorf("no leader for %s/%d", t, p)
}

type deleteRecordsResponse struct {
	ThrottleTimeMs int32                        `kafka:"min=v0,max=v1"`
	Topics         []deleteRecordsResponseTopic `kafka:"min=v0,max=v1"`
}

type deleteRecordsResponseTopic struct {
	Name       string                           `kafka:"min=v0,max=v1"`
	Partitions []deleteRecordsResponsePartition `kafka:"min=v0,max=v1"`
}

type deleteRecordsResponsePartition struct {
	PartitionIndex int32 `kafka:"min=v0,max=v1"`
	LowWatermark   int64 `kafka:"min=v0,max=v1"`
	ErrorCode      int16 `kafka:"min=v0,max=v1"`
}

func (r *deleteRecordsResponse) ApiKey() protocol.ApiKey { return protocol.DeleteRecords }

// The DeleteRecords API is registered with kafka-go's protocol package at
// init, before any test runs: registering it lazily raced with the
// transports of parallel tests, which read the same registry.
func init() {
	protocol.Register(&deleteRecordsRequest{}, &deleteRecordsResponse{})
}

// DeleteRecords deletes the records of topic's partition below offset, as
// retention would: the partition's log start moves to offset.
func DeleteRecords(tb testing.TB, topic string, partition int, offset int64) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	addr := kafka.TCP(Brokers(tb)...)
	res, err := transport.RoundTrip(ctx, addr, &deleteRecordsRequest{TimeoutMs: 30_000,
		Topics: []deleteRecordsTopic{{Name: topic, Partitions: []deleteRecordsPartition{{
			PartitionIndex: int32(partition), Offset: offset}}}}})
	if err == nil {
		r, ok := res.(*deleteRecordsResponse)
		switch {
		case !ok || len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1:
			err = errors.New("unexpected response")
		case r.Topics[0].Partitions[0].ErrorCode != 0:
			err = kafka.Error(r.Topics[0].Partitions[0].ErrorCode)
		case r.Topics[0].Partitions[0].LowWatermark != offset:
			err = fmt.Errorf("log start is %d, want %d", r.Topics[0].Partitions[0].LowWatermark, offset)
		}
	}
	if err != nil {
		tb.Fatalf("testenv: delete records of %s/%d below %d: %v", topic, partition, offset, err)
	}
}

// Produce writes records to topic's partition, acknowledged by every
// in-sync replica, and returns the offset of the first one. It tries again
// while the broker answers with a retriable error (a topic just created may
// not take records for a moment). An attempt reads the records' keys and
// values to their end, so each is rewound before every attempt: one that
// cannot be (not an io.Seeker) fails the test when a second attempt is
// needed, rather than being sent empty.
func Produce(tb testing.TB, topic string, partition int, records ...kafka.Record) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := Client(tb)
	for attempt := 0; ; attempt++ {
		if err := rewind(records, attempt > 0); err != nil {
			tb.Fatalf("testenv: produce to %s/%d again: %v", topic, partition, err)
		}
		resp, err := client.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: partition,
			RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(records...)})
		if err == nil {
			err = resp.Error
		}
		var kerr kafka.Error
		if err == nil {
			return resp.BaseOffset
		}
		if !errors.As(err, &kerr) || !kerr.Temporary() || ctx.Err() != nil {
			tb.Fatalf("testenv: produce to %s/%d: %v", topic, partition, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rewind seeks every key and value of records back to its start; one that
// cannot seek is an error when must is set.
func rewind(records []kafka.Record, must bool) error {
	for i := range records {
		for _, b := range []kafka.Bytes{records[i].Key, records[i].Value} {
			if b == nil {
				continue
			}
			s, ok := b.(io.Seeker)
			if !ok && !must {
				continue
			}
			if !ok {
				return fmt.Errorf("record %d: its key or value (%T) cannot be read again", i, b)
			}
			if _, err := s.Seek(0, io.SeekStart); err != nil {
				return fmt.Errorf("record %d: rewind: %w", i, err)
			}
		}
	}
	return nil
}
