package faultproxy

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// offsetCommitKey is the Kafka API key of OffsetCommit.
const offsetCommitKey = 8

// OffsetCommitErrors is a Filter for a proxy in front of a Kafka broker:
// while a code is set, the broker's answers to OffsetCommit requests
// (version 2, kafka-go's consumer groups) carry that error code for every
// partition, as a coordinator that cannot write offsets answers, and every
// other byte passes unchanged. It plays a broker that refuses commits while
// it serves fetches and heartbeats.
type OffsetCommitErrors struct {
	code atomic.Int32
}

// Set makes the answers carry code from now on; 0 lets them pass
// unchanged.
func (f *OffsetCommitErrors) Set(code int16) { f.code.Store(int32(code)) }

// NewLink implements Filter.
func (f *OffsetCommitErrors) NewLink() LinkFilter {
	return &offsetCommitLink{f: f, pending: map[int32]int16{}}
}

// offsetCommitLink follows one connection's Kafka frames (a 4-byte size,
// then the frame): requests from the client, answers from the server.
type offsetCommitLink struct {
	f            *OffsetCommitErrors
	client, serv []byte // bytes of an incomplete frame, each way

	mu      sync.Mutex
	pending map[int32]int16 // correlation ID → version of the OffsetCommit requests in flight
}

// frames returns the complete frames at the start of buf (and what is
// left).
func frames(buf []byte) (complete [][]byte, rest []byte) {
	for len(buf) >= 4 {
		n := int(binary.BigEndian.Uint32(buf))
		if n < 0 || len(buf) < 4+n {
			break
		}
		complete = append(complete, buf[:4+n])
		buf = buf[4+n:]
	}
	return complete, buf
}

func (l *offsetCommitLink) FromClient(b []byte) []byte {
	l.client = append(l.client, b...)
	complete, rest := frames(l.client)
	var out []byte
	for _, fr := range complete {
		// size, api key, api version, correlation ID
		if len(fr) >= 12 && int16(binary.BigEndian.Uint16(fr[4:])) == offsetCommitKey {
			l.mu.Lock()
			l.pending[int32(binary.BigEndian.Uint32(fr[8:]))] = int16(binary.BigEndian.Uint16(fr[6:]))
			l.mu.Unlock()
		}
		out = append(out, fr...)
	}
	l.client = append(l.client[:0], rest...)
	return out
}

func (l *offsetCommitLink) FromServer(b []byte) []byte {
	l.serv = append(l.serv, b...)
	complete, rest := frames(l.serv)
	var out []byte
	for _, fr := range complete {
		fr = append([]byte(nil), fr...)
		if len(fr) >= 8 {
			corr := int32(binary.BigEndian.Uint32(fr[4:]))
			l.mu.Lock()
			version, ok := l.pending[corr]
			delete(l.pending, corr)
			l.mu.Unlock()
			if code := int16(l.f.code.Load()); ok && code != 0 && version == 2 {
				setPartitionErrors(fr[8:], code)
			}
		}
		out = append(out, fr...)
	}
	l.serv = append(l.serv[:0], rest...)
	return out
}

// setPartitionErrors writes code into every partition of an OffsetCommit
// v2 answer's body: [topic: name (int16 length, bytes), [partition: index
// int32, error int16]]. A body it cannot read is left as it is.
func setPartitionErrors(body []byte, code int16) {
	off := 0
	u32 := func() (int, bool) {
		if off+4 > len(body) {
			return 0, false
		}
		v := int(int32(binary.BigEndian.Uint32(body[off:])))
		off += 4
		return v, true
	}
	topics, ok := u32()
	for t := 0; ok && t < topics; t++ {
		if off+2 > len(body) {
			return
		}
		off += 2 + int(int16(binary.BigEndian.Uint16(body[off:])))
		var parts int
		if parts, ok = u32(); !ok {
			return
		}
		for p := 0; p < parts; p++ {
			if off+6 > len(body) {
				return
			}
			binary.BigEndian.PutUint16(body[off+4:], uint16(code))
			off += 6
		}
	}
}
