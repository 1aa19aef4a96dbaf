package faultproxy_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idemkit/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server is a TCP server whose accepted connections the test drives.
type server struct {
	ln    net.Listener
	conns chan net.Conn
	wg    sync.WaitGroup
}

func newServer(t *testing.T) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, conns: make(chan net.Conn, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				close(s.conns)
				return
			}
			s.conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
		for c := range s.conns {
			c.Close()
		}
	})
	return s
}

// accept returns the server side of the next connection.
func (s *server) accept(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-s.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the server got no connection")
		return nil
	}
}

// echo echoes what c receives until c ends.
func echo(t *testing.T, c net.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(c, c)
	}()
	t.Cleanup(func() {
		c.Close()
		wg.Wait()
	})
}

func newProxy(t *testing.T, s *server) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

func read(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return string(b)
}

// silent fails unless c receives nothing, not even an end, for d: used
// only once what could have arrived was sent before a synchronisation point.
func silent(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	b := make([]byte, 1)
	n, err := c.Read(b)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: read %q, %v; want nothing", what, b[:n], err)
	}
}

func TestPass(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s)
	c := dial(t, p)
	echo(t, s.accept(t))
	write(t, c, "hello")
	if got := read(t, c, 5); got != "hello" {
		t.Fatalf("echo = %q", got)
	}
	if p.Conns() != 1 {
		t.Fatalf("Conns = %d, want 1", p.Conns())
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s)
	c := dial(t, p)
	echo(t, s.accept(t))
	const d = 100 * time.Millisecond
	p.SetLatency(d)
	p.Set(faultproxy.Latency)
	start := time.Now()
	write(t, c, "a")
	write(t, c, "b")
	if got := read(t, c, 2); got != "ab" {
		t.Fatalf("echo = %q, want ab in order", got)
	}
	// Each way adds d: the round trip takes at least 2d.
	if rtt := time.Since(start); rtt < 2*d {
		t.Fatalf("round trip %v, want at least %v", rtt, 2*d)
	}
}

// TestBlackhole: bytes sent in a blackhole, either way, never arrive; the
// connection stays open, and bytes sent after it pass again.
func TestBlackhole(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s)
	c := dial(t, p)
	sc := s.accept(t)
	write(t, c, "1")
	if got := read(t, sc, 1); got != "1" {
		t.Fatalf("server read %q", got)
	}
	p.Set(faultproxy.Blackhole)
	write(t, c, "lost")
	write(t, sc, "gone")
	waitFor(t, func() bool { return p.Dropped() == 8 }, "8 bytes dropped")
	p.Set(faultproxy.Pass)
	write(t, c, "2")
	write(t, sc, "3")
	if got := read(t, sc, 1); got != "2" {
		t.Fatalf("server read %q after the blackhole, want 2 (what the blackhole took is lost)", got)
	}
	if got := read(t, c, 1); got != "3" {
		t.Fatalf("client read %q after the blackhole, want 3", got)
	}
}

// TestReset: both sides of an open connection see a reset, not an orderly
// end.
func TestReset(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s)
	c := dial(t, p)
	sc := s.accept(t)
	write(t, c, "x")
	read(t, sc, 1)
	if n := p.ResetAll(); n != 1 {
		t.Fatalf("ResetAll reset %d connections, want 1", n)
	}
	for side, conn := range map[string]net.Conn{"client": c, "server": sc} {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := conn.Read(make([]byte, 1))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s read after the reset: %v, want ECONNRESET", side, err)
		}
	}
	p.Set(faultproxy.Reset)
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c2.Close()
		_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c2.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a connection made in mode Reset: %v, want ECONNRESET", err)
	}
}

// TestStrand: after a strand nothing passes either way, and the server side
// sees no end when the client leaves; a new connection passes.
func TestStrand(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s)
	c := dial(t, p)
	sc := s.accept(t)
	write(t, c, "x")
	read(t, sc, 1)
	if n := p.Strand(); n != 1 {
		t.Fatalf("Strand stranded %d connections, want 1", n)
	}
	write(t, c, "lost")
	write(t, sc, "gone")
	waitFor(t, func() bool { return p.Dropped() == 8 }, "8 bytes dropped")
	c.Close()
	waitFor(t, func() bool { return p.Swallowed() == 1 }, "the client's end swallowed")
	silent(t, sc, 200*time.Millisecond, "server side of a stranded connection whose client left")
	if p.Conns() != 1 {
		t.Fatalf("Conns = %d, want the stranded connection", p.Conns())
	}

	c2 := dial(t, p)
	echo(t, s.accept(t))
	write(t, c2, "new")
	if got := read(t, c2, 3); got != "new" {
		t.Fatalf("a new connection after a strand: %q", got)
	}
}

// TestStrandOn: StrandOn strands the one connection whose client sends a
// matching chunk, before the chunk reaches the server, and then disarms.
func TestStrandOn(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s)
	c1 := dial(t, p)
	s1 := s.accept(t)
	c2 := dial(t, p)
	s2 := s.accept(t)
	var calls int
	p.StrandOn(func(b []byte) bool {
		calls++
		return strings.HasPrefix(string(b), "produce")
	})
	write(t, c1, "fetch")
	if got := read(t, s1, 5); got != "fetch" {
		t.Fatalf("a chunk that does not match: %q", got)
	}
	write(t, c2, "produce")
	waitFor(t, func() bool { return p.Dropped() == 7 }, "the matching chunk dropped")
	silent(t, s2, 200*time.Millisecond, "server side of the connection stranded on its request")
	write(t, s2, "late")
	silent(t, c2, 200*time.Millisecond, "client side of the connection stranded on its request")
	write(t, c1, "produce")
	if got := read(t, s1, 7); got != "produce" {
		t.Fatalf("after StrandOn matched once, another connection: %q", got)
	}
	c3 := dial(t, p)
	echo(t, s.accept(t))
	write(t, c3, "produce")
	if got := read(t, c3, 7); got != "produce" {
		t.Fatalf("a new connection after StrandOn matched: %q", got)
	}
	if calls != 2 {
		t.Fatalf("match called %d times, want 2 (it disarms once it matched)", calls)
	}
}

// TestStrandMode: mode Strand strands the open connections and keeps new
// ones from the server.
func TestStrandMode(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s)
	c := dial(t, p)
	sc := s.accept(t)
	p.Set(faultproxy.Strand)
	write(t, sc, "gone")
	c2 := dial(t, p)
	write(t, c2, "nowhere")
	waitFor(t, func() bool { return p.Dropped() == 11 }, "11 bytes dropped")
	silent(t, c, 200*time.Millisecond, "client of a stranded connection")
	select {
	case <-s.conns:
		t.Fatal("a connection made in mode Strand reached the server")
	default:
	}
}

// waitFor polls cond, which the proxy's goroutines make true, for at most
// ten seconds.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
	}
}

// kafkaFrame is a size-prefixed Kafka frame of the given fields.
func kafkaFrame(fields ...any) []byte {
	var body []byte
	for _, f := range fields {
		switch v := f.(type) {
		case int16:
			body = binary.BigEndian.AppendUint16(body, uint16(v))
		case int32:
			body = binary.BigEndian.AppendUint32(body, uint32(v))
		case string:
			body = binary.BigEndian.AppendUint16(body, uint16(len(v)))
			body = append(body, v...)
		}
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// TestOffsetCommitErrors: once set, the answers to OffsetCommit v2
// requests carry the error code for every partition, whatever the chunks
// the bytes come in; other answers, and every answer once unset, pass
// unchanged.
func TestOffsetCommitErrors(t *testing.T) {
	var f faultproxy.OffsetCommitErrors
	l := f.NewLink()
	commit := kafkaFrame(int16(8), int16(2), int32(7), "client")
	fetch := kafkaFrame(int16(1), int16(11), int32(8), "client")
	answer := func(corr int32) []byte {
		return kafkaFrame(corr, int32(1), "orders", int32(2), int32(0), int16(0), int32(1), int16(0))
	}
	send := func(b []byte) []byte { // in chunks of 3 bytes
		var out []byte
		for len(b) > 0 {
			n := min(3, len(b))
			out = append(out, l.FromServer(b[:n])...)
			b = b[n:]
		}
		return out
	}
	if got := l.FromClient(append(commit, fetch...)); !bytes.Equal(got, append(commit, fetch...)) {
		t.Fatalf("requests changed: %x", got)
	}
	if got := send(answer(7)); !bytes.Equal(got, answer(7)) {
		t.Fatalf("answer changed while unset: %x", got)
	}
	f.Set(15)
	l.FromClient(commit)
	want := kafkaFrame(int32(7), int32(1), "orders", int32(2), int32(0), int16(15), int32(1), int16(15))
	if got := send(answer(7)); !bytes.Equal(got, want) {
		t.Fatalf("OffsetCommit answer: %x, want %x", got, want)
	}
	l.FromClient(fetch)
	if got := send(answer(8)); !bytes.Equal(got, answer(8)) {
		t.Fatalf("the answer to another request changed: %x", got)
	}
	f.Set(0)
	l.FromClient(commit)
	if got := send(answer(7)); !bytes.Equal(got, answer(7)) {
		t.Fatalf("answer changed once unset: %x", got)
	}
}
