package kafkaoffsets_test

import (
	"context"
	"net"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/listoffsets"

	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/retry"
)

// partialListOffsets answers ListOffsets the way kafka-go's transport does
// when one of the per-partition requests it split the request into failed on
// the wire while the others succeeded: that partition comes back with error
// code -1 (Unknown), the cause dropped.
type partialListOffsets struct{ lost int32 }

func (f partialListOffsets) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	t := req.(*listoffsets.Request).Topics[0]
	parts := make([]listoffsets.ResponsePartition, 0, len(t.Partitions))
	for _, p := range t.Partitions {
		rp := listoffsets.ResponsePartition{Partition: p.Partition, Timestamp: p.Timestamp, Offset: 10}
		if p.Partition == f.lost {
			rp = listoffsets.ResponsePartition{Partition: p.Partition, ErrorCode: -1, Timestamp: -1, Offset: -1}
		}
		parts = append(parts, rp)
	}
	return &listoffsets.Response{Topics: []listoffsets.ResponseTopic{{Topic: t.Topic, Partitions: parts}}}, nil
}

// A partition kafka-go reports as Unknown because its request was lost (seen
// when a broker restarts under a consumer group: the runner's position check
// returned from Run with "[-1] Unknown") is a connection-class error, which
// the runner waits out.
func TestLogRangeLostRequestIsAConnectionError(t *testing.T) {
	client := &kafka.Client{Addr: kafka.TCP("127.0.0.1:9"), Transport: partialListOffsets{lost: 1}}
	_, err := kafkaoffsets.LogRange(context.Background(), client, "t", 0, 1)
	if err == nil || !retry.IsConnection(err) {
		t.Fatalf("LogRange = %v, want a connection-class error", err)
	}
	got, err := kafkaoffsets.LogRange(context.Background(), client, "t", 0)
	if err != nil || got[0] != (kafkaoffsets.Range{Start: 10, Stable: 10, End: 10}) {
		t.Fatalf("LogRange of the answered partition = %v, %v", got, err)
	}
}
