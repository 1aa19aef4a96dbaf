package kafkaconn_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idemkit/kafkaconn"
)

// TestDefaultDialKeepalives: the connections of Dialer and Transport probe
// a silent peer after 15s, every 5s, 3 times (not the OS's two hours).
func TestDefaultDialKeepalives(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	kc := kafkaconn.Config{Brokers: []string{ln.Addr().String()}}
	d, err := kc.Dialer()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := kc.Transport()
	if err != nil {
		t.Fatal(err)
	}
	for name, dial := range map[string]func(context.Context, string, string) (net.Conn, error){
		"Dialer.DialFunc": d.DialFunc, "Transport.Dial": tr.Dial} {
		if dial == nil {
			t.Fatalf("%s is nil: kafka-go dials with Go's keepalive defaults (15s, 15s, the OS's probe count)", name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := dial(ctx, "tcp", ln.Addr().String())
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		_ = raw.Control(func(fd uintptr) {
			for opt, o := range map[string][2]int{"SO_KEEPALIVE": {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
				"TCP_KEEPIDLE": {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE}, "TCP_KEEPINTVL": {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
				"TCP_KEEPCNT": {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT}} {
				v, err := syscall.GetsockoptInt(int(fd), o[0], o[1])
				if err != nil {
					t.Errorf("%s: getsockopt %s: %v", name, opt, err)
				}
				got[opt] = v
			}
		})
		c.Close()
		want := map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}
		for opt, v := range want {
			if got[opt] != v {
				t.Errorf("%s: %s = %d, want %d", name, opt, got[opt], v)
			}
		}
	}
}

// TestDialOverride: Config.Dial opens the connections of a Transport.
func TestDialOverride(t *testing.T) {
	t.Parallel()
	called := make(chan string, 1)
	kc := kafkaconn.Config{Brokers: []string{"127.0.0.1:1"}, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case called <- addr:
		default:
		}
		return nil, syscall.ECONNREFUSED
	}}
	d, err := kc.Dialer()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.DialContext(ctx, "tcp", "127.0.0.1:1"); err == nil {
		t.Fatal("dial succeeded")
	}
	select {
	case addr := <-called:
		if addr != "127.0.0.1:1" {
			t.Fatalf("Dial got %s", addr)
		}
	default:
		t.Fatal("Config.Dial was not called")
	}
}
