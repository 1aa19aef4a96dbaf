// Package kafkaoffsets reads and moves what Kafka knows about a topic's
// partitions and a consumer group's place in them: the offsets each partition
// still holds (log start and end) and how far a read_committed reader can
// read (the last stable offset), the offset of the first record at or after
// a time, the group's committed offsets and its members. The CLI's consumer
// commands use it; the consumer may use it to check a stored position against
// the log.
//
// Every function takes the *kafka.Client to talk through, so that its
// transport (TLS, SASL) is the caller's. Requests that go to the group
// coordinator are retried for a while when the broker answers that the
// coordinator is loading, moving or not available yet.
package kafkaoffsets

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrNoTopic means the topic does not exist.
var ErrNoTopic = errors.New("topic does not exist")

// ErrGroupNotEmpty means Kafka refused to commit offsets from outside the
// group because the group has members (the broker's UNKNOWN_MEMBER_ID,
// ILLEGAL_GENERATION or REBALANCE_IN_PROGRESS for a simple commit).
var ErrGroupNotEmpty = errors.New("the consumer group has live members")

// Range is the offsets a partition holds. Start is the log start offset, the
// first offset still held (records below it were deleted by retention or
// DeleteRecords); End is the log end offset (the high watermark), the offset
// the next record will get. Start == End means the partition holds no record.
//
// Stable is the last stable offset: the first offset of the oldest
// transaction still open on the partition, or End when none is open. A
// read_committed reader (the consumer, the dead-letter tools) reads nothing
// at or after it until that transaction commits or aborts, so it is the end
// of what such a reader can read now. Start <= Stable <= End.
type Range struct {
	Start  int64 `json:"start"`
	Stable int64 `json:"stable"`
	End    int64 `json:"end"`
}

// Held reports whether an open transaction holds read_committed readers
// back: Stable < End.
func (r Range) Held() bool { return r.Stable < r.End }

// Contains reports whether a consumer may start at offset: Start <= offset <=
// End (starting at End means "from the next record on").
func (r Range) Contains(offset int64) bool { return r.Start <= offset && offset <= r.End }

// Partitions returns the IDs of topic's partitions in ascending order, or an
// error wrapping ErrNoTopic when the topic does not exist.
func Partitions(ctx context.Context, client *kafka.Client, topic string) ([]int, error) {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata for %s: %w", topic, err)
	}
	if len(md.Topics) != 1 || errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	if err := md.Topics[0].Error; err != nil {
		return nil, fmt.Errorf("metadata for %s: %w", topic, err)
	}
	ids := make([]int, 0, len(md.Topics[0].Partitions))
	for _, p := range md.Topics[0].Partitions {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	return ids, nil
}

// LogRange returns the log start, last stable offset and log end of each of
// topic's partitions (all of them when partitions is empty). A partition the
// topic does not have, or a topic that does not exist, is an error (the
// latter wrapping ErrNoTopic).
func LogRange(ctx context.Context, client *kafka.Client, topic string, partitions ...int) (map[int]Range, error) {
	if len(partitions) == 0 {
		var err error
		if partitions, err = Partitions(ctx, client, topic); err != nil {
			return nil, err
		}
	}
	// The last stable offset first: asked before the log end, it cannot
	// pass it (both only grow).
	stable := make([]kafka.OffsetRequest, 0, len(partitions))
	reqs := make([]kafka.OffsetRequest, 0, 2*len(partitions))
	for _, p := range partitions {
		stable = append(stable, kafka.LastOffsetOf(p))
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	lso, err := listOffsets(ctx, client, topic, kafka.ReadCommitted, stable)
	if err != nil {
		return nil, err
	}
	got, err := listOffsets(ctx, client, topic, kafka.ReadUncommitted, reqs)
	if err != nil {
		return nil, err
	}
	out := make(map[int]Range, len(partitions))
	for _, p := range partitions {
		po, ok := got[p]
		ls, lok := lso[p]
		if !ok || !lok || po.FirstOffset < 0 || po.LastOffset < 0 || ls.LastOffset < 0 {
			return nil, fmt.Errorf("offsets of %s/%d: no answer", topic, p)
		}
		// Records deleted meanwhile may have moved the start past it.
		out[p] = Range{Start: po.FirstOffset, Stable: min(max(ls.LastOffset, po.FirstOffset), po.LastOffset), End: po.LastOffset}
	}
	return out, nil
}

// AtTime returns, for each of topic's partitions given, the offset of the
// first record whose timestamp is at or after t, as Kafka's timestamp index
// finds it; a partition with no such record gets its log end (the offset the
// next record will get), as kafka-consumer-groups --to-datetime does.
func AtTime(ctx context.Context, client *kafka.Client, topic string, partitions []int, t time.Time) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, 0, 2*len(partitions))
	for _, p := range partitions {
		reqs = append(reqs, kafka.TimeOffsetOf(p, t), kafka.LastOffsetOf(p))
	}
	got, err := listOffsets(ctx, client, topic, kafka.ReadUncommitted, reqs)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(partitions))
	for _, p := range partitions {
		po, ok := got[p]
		if !ok || po.LastOffset < 0 {
			return nil, fmt.Errorf("offsets of %s/%d: no answer", topic, p)
		}
		out[p] = po.LastOffset
		for off := range po.Offsets { // one entry: the answer for t, or -1 for none
			if off >= 0 {
				out[p] = min(off, po.LastOffset) // the end was asked a moment apart
			}
		}
	}
	return out, nil
}

func listOffsets(ctx context.Context, client *kafka.Client, topic string, level kafka.IsolationLevel,
	reqs []kafka.OffsetRequest) (map[int]kafka.PartitionOffsets, error) {
	resp, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs},
		IsolationLevel: level})
	if err != nil {
		return nil, fmt.Errorf("offsets of %s: %w", topic, err)
	}
	out := map[int]kafka.PartitionOffsets{}
	for _, po := range resp.Topics[topic] {
		if errors.Is(po.Error, kafka.Unknown) {
			// kafka-go sends one request per partition and offset; when some
			// fail on the wire (connections to a broker that just restarted)
			// and others succeed, it reports the failed ones as Unknown (-1)
			// and drops the cause. Say it is a lost request, which
			// retry.IsConnection recognises: an outage, not a verdict.
			return nil, fmt.Errorf("offsets of %s/%d: %v: %w", topic, po.Partition, po.Error, errRequestLost)
		}
		if po.Error != nil {
			return nil, fmt.Errorf("offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po
	}
	return out, nil
}

// errRequestLost stands for the cause kafka-go drops when a ListOffsets
// request it split failed on the wire (see listOffsets).
var errRequestLost = &net.OpError{Op: "read", Net: "tcp",
	Err: errors.New("ListOffsets request lost (kafka-go reports it as Unknown)")}

// Committed returns group's committed offset for each of topic's partitions
// given. Partitions without a committed offset are absent from the map; a
// group Kafka does not know has none.
func Committed(ctx context.Context, client *kafka.Client, group, topic string, partitions []int) (map[int]int64, error) {
	var resp *kafka.OffsetFetchResponse
	err := retryCoordinator(ctx, func() error {
		var err error
		resp, err = client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group,
			Topics: map[string][]int{topic: partitions}})
		if err == nil {
			err = resp.Error
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("committed offset of group %s on %s/%d: %w", group, topic, p.Partition, p.Error)
		}
		if p.CommittedOffset >= 0 {
			out[p.Partition] = p.CommittedOffset
		}
	}
	return out, nil
}

// Group is what Kafka says about a consumer group.
type Group struct {
	// State is the broker's name for the group's state: Empty, Dead (Kafka
	// does not know the group), Stable, PreparingRebalance,
	// CompletingRebalance.
	State string
	// Members are the IDs of the group's members.
	Members []string
	// Assigned counts, per topic, the partitions assigned to the members.
	Assigned map[string]int
}

// Live reports whether the group has members: any state but Empty and Dead.
// Kafka accepts commits from outside the group only when it is not live.
func (g Group) Live() bool { return (g.State != "Empty" && g.State != "Dead") || len(g.Members) > 0 }

// Describe returns group's state and members.
func Describe(ctx context.Context, client *kafka.Client, group string) (Group, error) {
	var g Group
	err := retryCoordinator(ctx, func() error {
		resp, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err != nil {
			return err
		}
		if len(resp.Groups) != 1 {
			return fmt.Errorf("%d answers for one group", len(resp.Groups))
		}
		d := resp.Groups[0]
		if errors.Is(d.Error, kafka.GroupIdNotFound) { // newer brokers' word for Dead
			g = Group{State: "Dead"}
			return nil
		}
		if d.Error != nil {
			return d.Error
		}
		g = Group{State: d.GroupState, Assigned: map[string]int{}}
		for _, m := range d.Members {
			g.Members = append(g.Members, m.MemberID)
			for _, t := range m.MemberAssignments.Topics {
				g.Assigned[t.Topic] += len(t.Partitions)
			}
		}
		return nil
	})
	if err != nil {
		return Group{}, fmt.Errorf("describe group %s: %w", group, err)
	}
	return g, nil
}

// Commit commits offsets (partition → next offset to read) of topic for
// group as a client outside the group (generation -1, no member ID), which
// Kafka accepts only while the group has no member: otherwise the error wraps
// ErrGroupNotEmpty. Kafka creates a group it does not know. A partition's
// refusal fails the whole call; the other partitions may have been committed.
func Commit(ctx context.Context, client *kafka.Client, group, topic string, offsets map[int]int64) error {
	commits := make([]kafka.OffsetCommit, 0, len(offsets))
	for _, p := range slices.Sorted(maps.Keys(offsets)) {
		commits = append(commits, kafka.OffsetCommit{Partition: p, Offset: offsets[p]})
	}
	err := retryCoordinator(ctx, func() error {
		resp, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{topic: commits}})
		if err != nil {
			return err
		}
		var errs []error
		for _, p := range resp.Topics[topic] {
			if p.Error != nil {
				errs = append(errs, fmt.Errorf("partition %d: %w", p.Partition, p.Error))
			}
		}
		if len(errs) == 0 && len(resp.Topics[topic]) != len(commits) {
			return fmt.Errorf("%d of %d partitions answered", len(resp.Topics[topic]), len(commits))
		}
		return errors.Join(errs...)
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.IllegalGeneration),
		errors.Is(err, kafka.RebalanceInProgress):
		return fmt.Errorf("commit offsets of group %s: %w (%w)", group, ErrGroupNotEmpty, err)
	}
	return fmt.Errorf("commit offsets of group %s: %w", group, err)
}

// RemoveMembers removes members from group, as if each had left (the
// LeaveGroup request an administrator sends for them). A removed member
// learns it at its next heartbeat and joins again as a new member; until then
// it may still be processing.
func RemoveMembers(ctx context.Context, client *kafka.Client, group string, members []string) error {
	if len(members) == 0 {
		return nil
	}
	req := &kafka.LeaveGroupRequest{GroupID: group}
	for _, m := range members {
		req.Members = append(req.Members, kafka.LeaveGroupRequestMember{ID: m})
	}
	err := retryCoordinator(ctx, func() error {
		resp, err := client.LeaveGroup(ctx, req)
		if err != nil {
			return err
		}
		errs := []error{resp.Error}
		for _, m := range resp.Members {
			if m.Error != nil && !errors.Is(m.Error, kafka.UnknownMemberId) { // gone already
				errs = append(errs, fmt.Errorf("member %s: %w", m.ID, m.Error))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return fmt.Errorf("remove members of group %s: %w", group, err)
	}
	return nil
}

// coordinatorWait bounds how long a request to the group coordinator is
// retried while the broker says the coordinator is not ready.
const coordinatorWait = 10 * time.Second

// retryCoordinator runs fn again while it fails because the group
// coordinator is loading, moving or not available yet, for up to
// coordinatorWait.
func retryCoordinator(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(coordinatorWait)
	for {
		err := fn()
		if err == nil || !coordinatorNotReady(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func coordinatorNotReady(err error) bool {
	return errors.Is(err, kafka.NotCoordinatorForGroup) || errors.Is(err, kafka.GroupCoordinatorNotAvailable) ||
		errors.Is(err, kafka.GroupLoadInProgress)
}
