// Package faultplan is what the fault tests (test/chaos, test/failover,
// test/cluster) produce and read: a plan of messages over keys, numbered
// per key, with producer duplicates, so that a test can tell a message
// lost, applied twice or applied out of its key's order.
package faultplan

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
)

// SeqHeader carries a message's number within its key, from 0.
const SeqHeader = "seq"

// Plan is what the producer sends: distinct messages m-0 … m-(Distinct-1)
// over Keys, each key's messages numbered in send order (SeqHeader), with
// producer duplicates (an earlier message of the same key sent again, same
// ID) mixed in.
type Plan struct {
	Sends    []kafka.Message
	Distinct int
	Keys     []string
}

// New makes a plan of distinct messages and duplicates over keys, the
// same for the same seed.
func New(distinct, duplicates, keys int, seed uint64) *Plan {
	rng := rand.New(rand.NewPCG(seed, seed))
	p := &Plan{Distinct: distinct}
	for k := range keys {
		p.Keys = append(p.Keys, fmt.Sprintf("k-%03d", k))
	}
	next := make([]int, keys)
	var sent []kafka.Message
	for i, dups := 0, 0; i < distinct || dups < duplicates; {
		if dups < duplicates && i > 0 && (i >= distinct || rng.IntN(distinct) < duplicates) {
			p.Sends = append(p.Sends, sent[rng.IntN(len(sent))])
			dups++
			continue
		}
		k := rng.IntN(keys)
		m := kafka.Message{Key: []byte(p.Keys[k]), Value: []byte("payload " + strconv.Itoa(i)),
			Headers: []kafka.Header{
				{Key: consumer.IDHeaderDefault, Value: []byte("m-" + strconv.Itoa(i))},
				{Key: SeqHeader, Value: []byte(strconv.Itoa(next[k]))},
			}}
		next[k]++
		sent = append(sent, m)
		p.Sends = append(p.Sends, m)
		i++
	}
	return p
}

// IDs returns the plan's distinct IDs.
func (p *Plan) IDs() []string {
	out := make([]string, p.Distinct)
	for i := range out {
		out[i] = "m-" + strconv.Itoa(i)
	}
	return out
}

// Header returns the value of m's header key, "" when it has none.
func Header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
