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
// idemkit_consumer_position of each (nothing while r holds none), and
// idemkit_consumer_partitions_held, how many it holds (0 during a
// rebalance; absent when no runner of the consumer runs). A Monitor
// (Telemetry.Monitor) reports the partitions no runner of this process
// holds, from the tables, and the parked messages and the ages.
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
		parts := r.Partitions()
		o.ObserveInt64(in.held, int64(len(parts)), c.base.obs...)
		for _, p := range parts {
			opts := c.partitionAttrs(p.Partition)
			o.ObserveInt64(in.lag, p.Lag, opts.obs...)
			if p.Next >= 0 { // a start sentinel (first or last offset) is no position
				o.ObserveInt64(in.position, p.Next, opts.obs...)
			}
		}
		return nil
	}, in.held, in.lag, in.position)
	if err != nil {
		return fmt.Errorf("idemotel: register the consumer's gauges: %w", err)
	}
	c.reg, c.runner = reg, r
	c.t.observe(c.name, c.topic, r, true)
	return nil
}

// partitionAttrs returns the attributes of a partition's series, made once
// per partition.
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
	c.t.observe(c.name, c.topic, c.runner, false)
	return err
}
