package idemredis

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/idemhttp"
)

// PrefixDefault starts every key of a Store whose Config.Prefix is empty.
const PrefixDefault = "idemkit:idemhttp:"

// ErrInvalidConfig is wrapped by the errors of New for a bad Config.
var ErrInvalidConfig = fmt.Errorf("idemredis: %w", idemkit.ErrInvalidConfig)

// Config says where a Store's keys live.
type Config struct {
	// Prefix starts every key (and pub/sub channel) of the store, so that
	// several services or environments can share a Redis. At most 200
	// bytes. Defaults to PrefixDefault.
	Prefix string
}

// Store keeps idempotency records in Redis: an idemhttp.Backend for
// idemhttp.NewWithBackend. It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	prefix string
	hub    hub
}

// hub is the store's one pub/sub subscription, to the done channels of
// every scope under its prefix (a pattern), shared by the requests of this
// process that wait: it is opened for the first waiter and closed with the
// last, and fans each message out to the waiters of its channel.
type hub struct {
	mu      sync.Mutex
	sub     *redis.PubSub
	stopped chan struct{} // closed when the fan-out goroutine returns
	waiters map[string]map[chan struct{}]struct{}
	n       int
}

// watch registers a waiter for channel: its returned channel receives when
// a message is published on it. The subscription is active when watch
// returns, so a message published after it is not missed. stop unregisters.
func (s *Store) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	h := &s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sub == nil {
		sub := s.client.PSubscribe(ctx, globEscape(s.prefix)+"{*}:done")
		if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
			_ = sub.Close()
			return nil, nil, fmt.Errorf("idemredis: wait for the request in flight: subscribe: %w", err)
		}
		h.sub, h.stopped, h.waiters = sub, make(chan struct{}), map[string]map[chan struct{}]struct{}{}
		msgs, stopped := sub.Channel(), h.stopped
		go func() {
			defer close(stopped)
			for m := range msgs {
				h.mu.Lock()
				for c := range h.waiters[m.Channel] {
					select {
					case c <- struct{}{}:
					default:
					}
				}
				h.mu.Unlock()
			}
		}()
	}
	c := make(chan struct{}, 1)
	if h.waiters[channel] == nil {
		h.waiters[channel] = map[chan struct{}]struct{}{}
	}
	h.waiters[channel][c] = struct{}{}
	h.n++
	stop := func() {
		h.mu.Lock()
		delete(h.waiters[channel], c)
		if len(h.waiters[channel]) == 0 {
			delete(h.waiters, channel)
		}
		h.n--
		var (
			sub     *redis.PubSub
			stopped chan struct{}
		)
		if h.n == 0 {
			sub, stopped, h.sub = h.sub, h.stopped, nil
		}
		h.mu.Unlock()
		if sub != nil {
			_ = sub.Close()
			<-stopped
		}
	}
	return c, stop, nil
}

// globEscape escapes the glob characters of a Redis pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// New returns a Store on client (a *redis.Client, a *redis.ClusterClient or
// a *redis.Ring; the caller owns it and closes it). cfg may be nil, meaning
// every default. New does not talk to Redis.
func New(client redis.UniversalClient, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if len(c.Prefix) > 200 || strings.ContainsAny(c.Prefix, "{}") {
		return nil, fmt.Errorf("%w: Prefix %q: at most 200 bytes, without braces (they make the cluster hash tag)",
			ErrInvalidConfig, c.Prefix)
	}
	return &Store{client: client, prefix: c.Prefix}, nil
}

// keys are the keys of one scope, on one Redis Cluster slot: the hash tag
// is the scope's hash.
type keys struct {
	rec, lock, done string
}

// keysOf returns the keys of (account, operation, key). The scope is hashed
// (SHA-256, 128 bits kept): Redis keys stay short whatever the scope, and
// the idempotency key itself is not spelled out in them.
func (s *Store) keysOf(account, operation, key string) keys {
	var b bytes.Buffer
	for _, f := range []string{"idemredis/1", account, operation, key} {
		var n [binary.MaxVarintLen64]byte
		b.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		b.WriteString(f)
	}
	sum := sha256.Sum256(b.Bytes())
	base := s.prefix + "{" + hex.EncodeToString(sum[:16]) + "}:"
	return keys{rec: base + "rec", lock: base + "lock", done: base + "done"}
}

// The scripts run atomically in Redis: no other command runs between their
// steps, so that a reservation cannot slip between a completion's record
// and its lock's deletion.
var (
	// KEYS: rec, lock. ARGV: lock value, lock lifetime (ms).
	// Returns {"rec", record} | {"held"} | {"lock", lock value, pttl}.
	reserveScript = redis.NewScript(`
local rec = redis.call('GET', KEYS[1])
if rec then return {'rec', rec} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'held'} end
return {'lock', redis.call('GET', KEYS[2]) or '', redis.call('PTTL', KEYS[2])}
`)
	// KEYS: rec, lock, done. ARGV: lock value, record, TTL (ms).
	// Returns 1 when completed, 0 when another request holds or completed
	// the key. A lock that expired just before (the handler finished a bit
	// after its lease) while nobody else took the key still completes: the
	// effect happened, and dropping its record would run it again.
	completeScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[2])
if cur ~= ARGV[1] and (cur or redis.call('EXISTS', KEYS[1]) == 1) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', KEYS[3], 'completed')
return 1
`)
	// KEYS: lock, done. ARGV: lock value. Returns 1 when released.
	releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], 'released')
return 1
`)
)

// record is the stored value of a completed request.
type record struct {
	Fingerprint []byte      `json:"fp"`
	Status      int         `json:"status"`
	Header      http.Header `json:"header,omitempty"`
	Body        []byte      `json:"body"`
}

// Reserve implements idemhttp.Backend: SET NX PX of the scope's lock with a
// fresh fencing token, unless the scope has a completed record (then its
// replay) or a holder (then 409 or, with req.Wait, a wait for it, woken by
// the holder's completion or release on the scope's pub/sub channel, or by
// its lock's expiry).
func (s *Store) Reserve(ctx context.Context, req *idemhttp.Request) (idemhttp.Reservation, error) {
	if req.Lease < time.Millisecond || req.TTL < time.Millisecond {
		return idemhttp.Reservation{}, fmt.Errorf("idemredis: reserve: Lease %v and TTL %v must be at least 1ms", req.Lease, req.TTL)
	}
	k := s.keysOf(req.Account, req.Operation, req.Key)
	lockTTL := req.Lease
	if req.NoTakeover {
		lockTTL = req.TTL // held until a reconciler frees it (Forget) or it expires
	}
	var (
		wake <-chan struct{}
		stop func()
	)
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	deadline := time.Now().Add(req.Wait)
	for {
		token := newToken()
		value := token + " " + hex.EncodeToString(req.Fingerprint)
		start := time.Now()
		out, err := reserveScript.Run(ctx, s.client, []string{k.rec, k.lock}, value, lockTTL.Milliseconds()).Slice()
		if err != nil {
			return idemhttp.Reservation{}, fmt.Errorf("idemredis: reserve: %w", err)
		}
		res, pttl, err := decodeReserve(out)
		if err != nil {
			return idemhttp.Reservation{}, err
		}
		if res.Hold == nil && res.State == "" {
			return idemhttp.Reservation{Hold: &hold{s: s, k: k, value: value, req: req, leaseEnd: start.Add(req.Lease)}}, nil
		}
		left := time.Until(deadline)
		if res.State != idemhttp.StateProcessing || !req.SameRequest(res.Fingerprint) || left <= 0 {
			return res, nil
		}
		if wake == nil {
			// Watch, then look again: a completion between the first look
			// and the watch is not missed.
			if wake, stop, err = s.watch(ctx, k.done); err != nil {
				return idemhttp.Reservation{}, err
			}
			continue
		}
		wait := left
		if pttl > 0 {
			wait = min(wait, time.Duration(pttl+1)*time.Millisecond) // the holder's lease may end first
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, nil // answered 409; the client is gone anyway
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// decodeReserve reads the reserve script's answer: a Reservation with
// neither Hold nor State means the key was reserved.
func decodeReserve(out []any) (idemhttp.Reservation, int64, error) {
	bad := func() (idemhttp.Reservation, int64, error) {
		return idemhttp.Reservation{}, 0, fmt.Errorf("idemredis: reserve: unexpected answer %v", out)
	}
	if len(out) == 0 {
		return bad()
	}
	switch out[0] {
	case "held":
		return idemhttp.Reservation{}, 0, nil
	case "rec":
		if len(out) != 2 {
			return bad()
		}
		v, ok := out[1].(string)
		if !ok {
			return bad()
		}
		var r record
		if err := json.Unmarshal([]byte(v), &r); err != nil {
			return idemhttp.Reservation{}, 0, fmt.Errorf("idemredis: reserve: stored record: %w", err)
		}
		return idemhttp.Reservation{State: idemhttp.StateCompleted, Fingerprint: r.Fingerprint,
			Response: idemhttp.Response{Status: r.Status, Header: r.Header, Body: r.Body}}, 0, nil
	case "lock":
		if len(out) != 3 {
			return bad()
		}
		v, ok1 := out[1].(string)
		pttl, ok2 := out[2].(int64)
		if !ok1 || !ok2 {
			return bad()
		}
		res := idemhttp.Reservation{State: idemhttp.StateProcessing}
		if _, fp, found := strings.Cut(v, " "); found {
			if b, err := hex.DecodeString(fp); err == nil {
				res.Fingerprint = b
			}
		}
		return res, pttl, nil
	}
	return bad()
}

// hold is a request's hold on its scope: the lock with value (token and
// fingerprint), until leaseEnd.
type hold struct {
	s        *Store
	k        keys
	value    string
	req      *idemhttp.Request
	leaseEnd time.Time
}

// Run calls f with a context that ends with the lease, and no transaction.
func (h *hold) Run(ctx context.Context, f func(context.Context, pgx.Tx)) {
	hctx, cancel := context.WithDeadline(ctx, h.leaseEnd)
	defer cancel()
	f(hctx, nil)
}

// finishTimeout bounds completion and release, which run detached from the
// request's context: a client that hung up must not leave its key held.
const finishTimeout = 10 * time.Second

// Complete stores resp with the TTL and frees the lock, provided the lock
// still has this hold's token (compare-and-set in one script).
func (h *hold) Complete(ctx context.Context, resp idemhttp.Response) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	v, err := json.Marshal(record{Fingerprint: h.req.Fingerprint, Status: resp.Status, Header: resp.Header, Body: body})
	if err != nil {
		return fmt.Errorf("idemredis: complete: %w", err)
	}
	n, err := completeScript.Run(ctx, h.s.client, []string{h.k.rec, h.k.lock, h.k.done}, h.value, v,
		h.req.TTL.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("idemredis: complete: %w", err)
	}
	if n != 1 {
		return fmt.Errorf("%w: the lease ended and the key is no longer held with this request's token", idemhttp.ErrLeaseLost)
	}
	return nil
}

// Release frees the lock if it still has this hold's token.
func (h *hold) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	if err := releaseScript.Run(ctx, h.s.client, []string{h.k.lock, h.k.done}, h.value).Err(); err != nil {
		return fmt.Errorf("idemredis: release: %w", err)
	}
	return nil
}

// Forget deletes the record and the lock of (account, operation, key): the
// next request with the key runs anew. It is the reconciler's way out for
// a key held with Config.NoLeaseTakeover by a holder that crashed, once you
// checked that its effect did not happen (or decided to repeat it). It
// reports whether there was anything to delete.
func (s *Store) Forget(ctx context.Context, account, operation, key string) (bool, error) {
	k := s.keysOf(account, operation, key)
	n, err := s.client.Del(ctx, k.rec, k.lock).Result()
	if err != nil {
		return false, fmt.Errorf("idemredis: forget: %w", err)
	}
	return n > 0, nil
}

// newToken returns a random fencing token: 128 bits, so that two
// reservations of a key never share one.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

var _ idemhttp.Backend = (*Store)(nil)
