package consumer

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestCoordinatorBusy: the offset commit errors a live coordinator answers
// while it cannot write __consumer_offsets keep the generation; errors that
// end it (or lose the connection to the coordinator) do not.
func TestCoordinatorBusy(t *testing.T) {
	for _, tc := range []struct {
		err  error
		busy bool
	}{
		{kafka.GroupCoordinatorNotAvailable, true},
		{fmt.Errorf("commit: %w", kafka.GroupCoordinatorNotAvailable), true},
		{kafka.GroupLoadInProgress, true},
		{kafka.RequestTimedOut, true},
		{kafka.NotEnoughReplicas, true},
		{kafka.NotEnoughReplicasAfterAppend, true},
		{kafka.NotCoordinatorForGroup, false}, // the generation's connection is to the old coordinator
		{kafka.IllegalGeneration, false},
		{kafka.UnknownMemberId, false},
		{kafka.RebalanceInProgress, false},
		{io.EOF, false},
		{errors.New("other"), false},
	} {
		if got := coordinatorBusy(tc.err); got != tc.busy {
			t.Errorf("coordinatorBusy(%v) = %v, want %v", tc.err, got, tc.busy)
		}
	}
}
