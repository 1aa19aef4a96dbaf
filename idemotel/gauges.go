package idemotel

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idemkit/consumer"
)

// ErrObserving is returned by Consumer.Observe when the consumer already
// observes a runner.
var ErrObserving = errors.New("idemotel: consumer already observes a runner")

// Observe registers the gauges of the partitions r holds, read from
// r.Partitions at each collection (no I/O): idemkit_consumer_lag and
// idemkit_consumer_position per partition, idemkit_consumer_parked_messages;
// nothing while r holds no partition, and, as
// idemkit_consumer_partitions_held, how many it holds (0 then). What the
// tables say whichever process holds the partitions (the lag of a stopped
// consumer, the oldest parked message, the oldest processed record, the
// retention) comes from a Monitor (Telemetry.Monitor).
//
// r must be the runner made from the consumer.Config given to
// Telemetry.Consumer. Close unregisters the gauges.
func (c *Consumer) Observe(r *consumer.Runner) error {
	if r == nil {
		return fmt.Errorf("%w: nil runner", ErrInvalidConfig)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reg != nil {
		return ErrObserving
	}
	in := &c.t.consumer
	reg, err := c.t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.observe(o, r)
		return nil
	}, in.lag, in.position, in.parked, in.held)
	if err != nil {
		return fmt.Errorf("idemotel: register the consumer's gauges: %w", err)
	}
	c.reg = reg
	return nil
}

// Close unregisters the gauges Observe registered. The hooks and the
// middleware stay in the consumer's configuration: they count as long as
// the runner runs.
func (c *Consumer) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reg == nil {
		return nil
	}
	err := c.reg.Unregister()
	c.reg = nil
	return err
}

func (c *Consumer) observe(o metric.Observer, r *consumer.Runner) {
	in := &c.t.consumer
	parts := r.Partitions()
	o.ObserveInt64(in.held, int64(len(parts)), c.base.obs...)
	if len(parts) == 0 {
		return
	}
	var parked int64
	for _, p := range parts {
		opts := c.partitionAttrs(p.Partition)
		o.ObserveInt64(in.lag, p.Lag, opts.obs...)
		if p.Next >= 0 { // a start sentinel (first or last offset) is no position
			o.ObserveInt64(in.position, p.Next, opts.obs...)
		}
		parked += int64(p.Parked)
	}
	o.ObserveInt64(in.parked, parked, c.base.obs...)
}

// partitionAttrs returns the attributes of a partition's series, made once
// per partition. Only the callback calls it, under no lock of ours: the SDK
// runs one collection at a time per reader, but several readers may collect
// at once.
func (c *Consumer) partitionAttrs(partition int) attrOpts {
	c.partMu.Lock()
	defer c.partMu.Unlock()
	opts, ok := c.partitions[partition]
	if !ok {
		opts = attrs(keyConsumer, c.name, keyTopic, c.topic, keyPartition, strconv.Itoa(partition))
		c.partitions[partition] = opts
	}
	return opts
}
