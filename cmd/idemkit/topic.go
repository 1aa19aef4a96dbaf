package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/idemkit/idemkit/kafkaconn"
)

const topicCreateHelp = `Creates each topic named, with -partitions partitions and -replicas
replicas (by default the broker's default.replication.factor), unless it exists (an existing topic is left as it is, whatever
its partitions), and waits until the cluster lists every partition with a
leader. idemkit never creates topics on its own: the consumer's topic, the
outbox's destinations and the dead-letter topics (T.dlq) are created with
this or with your own tooling.`

func topicCmd(ctx context.Context, cmd *command, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var c conn
	c.registerKafka(fs)
	partitions := fs.Int("partitions", 6, "partitions of each new topic")
	replicas := fs.Int("replicas", -1, "replicas of each partition, the replication factor (-1: the broker's default.replication.factor)")
	wait := fs.Duration("wait", 30*time.Second, "longest wait for the cluster to list each new topic")
	topics, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(topics) == 0:
		return usagef("topic create takes the names of the topics to create")
	case *partitions < 1 || *replicas < 1 && *replicas != -1:
		return usagef("topic create: -partitions must be at least 1, -replicas at least 1 or -1 (the broker's default)")
	case *wait <= 0:
		return usagef("topic create: -wait must be positive")
	}
	kc, err := c.kafkaConn()
	if err != nil {
		return err
	}
	for _, topic := range topics {
		if topic == "" {
			return usagef("topic create: an empty topic name")
		}
		tctx, cancel := context.WithTimeout(ctx, *wait)
		err := kafkaconn.CreateTopic(tctx, kc, topic, *partitions, *replicas)
		cancel()
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "topic %s: ready\n", topic)
	}
	return nil
}
