// Package faultproxy is a loopback TCP proxy for fault tests: it relays
// connections to one server and, on demand, plays the faults of a real
// network between a client and that server: a blackhole (bytes lost both
// ways, connections kept), added latency, connection resets, and stranded
// connections (silent for good: no byte, no FIN, no RST ever reaches the
// server again, as when a NAT or firewall forgets the flow).
//
// The proxy runs on loopback: the kernels at both ends still acknowledge
// what they receive, so TCP keepalives succeed through every fault. What
// this proxy shows is how clients and servers behave when the peer's
// application goes silent; a fault that also swallows acknowledgements
// (where keepalives would fire) needs packet filtering instead.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what the proxy does with the traffic of its connections.
type Mode int32

const (
	// Pass relays every byte both ways.
	Pass Mode = iota
	// Blackhole drops every byte both ways and keeps the connections
	// open; an end (a side that closes or resets) still passes. A
	// connection accepted meanwhile never reaches the server (its bytes
	// are dropped for good). Bytes dropped from a stream break it:
	// once Pass is back, a connection that sent or was sent bytes in the
	// blackhole carries a broken protocol stream; idle ones work again.
	Blackhole
	// Latency delays every chunk of bytes, each way, by the latency set
	// with SetLatency, keeping their order.
	Latency
	// Reset resets (RST) both sides of every connection at once, and of
	// every connection accepted while the mode lasts.
	Reset
	// Strand strands every connection at once: no further byte either way,
	// and no FIN or RST to the server side, whose socket is kept open and
	// silent until the proxy is closed; the client side is kept open and
	// silent too. Connections accepted while the mode lasts never reach the
	// server. A stranded connection stays stranded after the mode changes.
	Strand
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Latency:
		return "latency"
	case Reset:
		return "reset"
	case Strand:
		return "strand"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// Proxy relays the connections it accepts on its loopback address to one
// target. Its methods are safe for concurrent use.
type Proxy struct {
	ln      net.Listener
	target  string
	mode    atomic.Int32
	latency atomic.Int64
	done    chan struct{}

	dropped  atomic.Int64 // bytes dropped
	swallows atomic.Int64 // ends (EOF, errors) not passed on

	armMu    sync.Mutex
	strandOn func([]byte) bool // armed by StrandOn; nil once it matched

	filter atomic.Pointer[Filter] // set by SetFilter: rewrites new connections' bytes

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

// New starts a proxy to target (host:port) on a free loopback port, in
// mode Pass.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, done: make(chan struct{}), links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// SetLatency sets the delay of mode Latency.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Set switches to mode m. Reset and Strand act at once on every open
// connection; the other modes act on the next bytes.
func (p *Proxy) Set(m Mode) {
	p.mode.Store(int32(m))
	switch m {
	case Reset:
		p.each((*link).reset)
	case Strand:
		p.each((*link).strand)
	}
}

// Strand strands every open connection, as Set(Strand), and returns how
// many it stranded; the mode stays as it was, so later connections are
// relayed as before (a NAT that forgot its flows still passes new ones).
func (p *Proxy) Strand() int { return p.each((*link).strand) }

// ResetAll resets every open connection, as Set(Reset), and returns how
// many it reset; the mode stays as it was.
func (p *Proxy) ResetAll() int { return p.each((*link).reset) }

// Conns returns how many connections are open (stranded ones included).
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Dropped returns how many bytes the proxy dropped (blackhole, strand).
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Swallowed returns how many ends of a side (a FIN, an error) the proxy
// did not pass on to the other side because the connection was stranded.
func (p *Proxy) Swallowed() int64 { return p.swallows.Load() }

// Close stops the proxy: it closes the listener and both sides of every
// connection, stranded ones too, and returns once its goroutines are done.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	err := p.ln.Close()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

// StrandOn arms the proxy: the first chunk of bytes a client sends, on a
// connection open now or later, for which match returns true strands that
// connection before the chunk reaches the server, as Strand does. It
// strands one connection, then disarms. A test uses it to strand exactly
// the connection that carries a given request, whichever connection of a
// pool the client picks for it. match is called from the proxy's
// goroutines, one call at a time.
func (p *Proxy) StrandOn(match func(chunk []byte) bool) {
	p.armMu.Lock()
	p.strandOn = match
	p.armMu.Unlock()
}

// Filter rewrites the bytes of each connection the proxy accepts once it is
// set: NewLink returns the rewriter of one connection.
type Filter interface {
	NewLink() LinkFilter
}

// LinkFilter rewrites one connection's bytes: each method gets a chunk read
// from that side and returns what to pass on; it may hold bytes back (an
// incomplete frame) and pass them on with a later chunk. Each method is
// called from one goroutine at a time.
type LinkFilter interface {
	FromClient(b []byte) []byte
	FromServer(b []byte) []byte
}

// SetFilter makes f rewrite the bytes of the connections accepted from now
// on (nil: none); open connections keep theirs.
func (p *Proxy) SetFilter(f Filter) {
	if f == nil {
		p.filter.Store(nil)
		return
	}
	p.filter.Store(&f)
}

// strandsOn reports whether the client chunk b strands l, and disarms
// StrandOn when it does.
func (p *Proxy) strandsOn(b []byte) bool {
	p.armMu.Lock()
	defer p.armMu.Unlock()
	if p.strandOn == nil || !p.strandOn(b) {
		return false
	}
	p.strandOn = nil
	return true
}

func (p *Proxy) each(f func(*link) bool) int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	n := 0
	for _, l := range links {
		if f(l) {
			n++
		}
	}
	return n
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		l := &link{p: p, client: c}
		if f := p.filter.Load(); f != nil {
			l.filter = (*f).NewLink()
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// link is one relayed connection.
type link struct {
	p      *Proxy
	filter LinkFilter // nil: bytes pass as they are
	client net.Conn
	server net.Conn // nil until dialled; nil for good when accepted in a blackhole or strand

	mu       sync.Mutex
	stranded bool
	ended    bool // reset or closed
}

func (l *link) run() {
	defer l.p.wg.Done()
	defer l.forget()
	switch l.p.Mode() {
	case Reset:
		l.reset()
		return
	case Blackhole, Strand:
		l.mu.Lock()
		l.stranded = true
		l.mu.Unlock()
		l.pump(l.client, nil, false) // drops what the client sends until it leaves or Close
		l.park()
		return
	}
	server, err := net.DialTimeout("tcp", l.p.target, 10*time.Second)
	if err != nil {
		resetConn(l.client)
		return
	}
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		server.Close()
		return
	}
	l.server = server
	l.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.pump(server, l.client, false)
	}()
	l.pump(l.client, server, true)
	wg.Wait()
	l.park()
}

// park holds a stranded link's sockets open until the proxy closes; a
// link that ended otherwise closes them now.
func (l *link) park() {
	l.mu.Lock()
	stranded := l.stranded && !l.ended
	l.mu.Unlock()
	if stranded {
		<-l.p.done
	}
	l.close()
}

func (l *link) forget() {
	l.p.mu.Lock()
	delete(l.p.links, l)
	l.p.mu.Unlock()
}

// pump relays src to dst (nil: nowhere) chunk by chunk, as the mode says;
// fromClient says src is the client, whose chunks StrandOn looks at.
// At src's end it half-closes dst, unless the link is stranded.
func (l *link) pump(src, dst net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && fromClient && !l.isStranded() && l.p.strandsOn(buf[:n]) {
			l.strand()
		}
		chunk := buf[:n]
		if n > 0 && l.filter != nil && dst != nil {
			if fromClient {
				chunk = l.filter.FromClient(chunk)
			} else {
				chunk = l.filter.FromServer(chunk)
			}
		}
		if len(chunk) > 0 && !l.forward(dst, chunk) {
			l.p.dropped.Add(int64(len(chunk)))
		}
		if err != nil {
			l.mu.Lock()
			stranded, ended := l.stranded, l.ended
			l.mu.Unlock()
			switch {
			case ended:
			case stranded || dst == nil:
				l.p.swallows.Add(1)
			case errors.Is(err, io.EOF):
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			default:
				// src was reset or failed: pass the reset on.
				resetConn(dst)
			}
			return
		}
	}
}

// forward writes b to dst as the mode says; it returns false when b was
// dropped.
func (l *link) forward(dst net.Conn, b []byte) bool {
	l.mu.Lock()
	stranded := l.stranded
	l.mu.Unlock()
	if stranded || dst == nil {
		return false
	}
	switch l.p.Mode() {
	case Blackhole:
		return false
	case Latency:
		t := time.NewTimer(time.Duration(l.p.latency.Load()))
		select {
		case <-t.C:
		case <-l.p.done:
			t.Stop()
			return false
		}
		l.mu.Lock()
		stranded = l.stranded
		l.mu.Unlock()
		if stranded {
			return false
		}
	}
	_, err := dst.Write(b)
	return err == nil
}

func (l *link) isStranded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stranded
}

// strand makes the link silent for good; it reports whether it was open.
func (l *link) strand() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stranded || l.ended {
		return false
	}
	l.stranded = true
	return true
}

// reset resets both sides; it reports whether the link was open.
func (l *link) reset() bool {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return false
	}
	l.ended = true
	server := l.server
	l.mu.Unlock()
	resetConn(l.client)
	if server != nil {
		resetConn(server)
	}
	return true
}

func (l *link) close() {
	l.mu.Lock()
	l.ended = true
	server := l.server
	l.mu.Unlock()
	l.client.Close()
	if server != nil {
		server.Close()
	}
}

// resetConn closes c with an RST rather than a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
