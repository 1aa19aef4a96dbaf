package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"
)

// SessionTTLDefault is how long a sign-in lasts.
const SessionTTLDefault = 12 * time.Hour

// sessions issues and checks the sign-in cookie's value: a session, never
// the credential it was opened with. It is a random nonce, its expiry and
// the principal's name, with an HMAC over them under the console's secret:
// only this console (or one sharing its Secret) makes one, and one past its
// expiry is refused whatever the browser keeps. Sign-out revokes the
// session's nonce in this process until the session would have expired.
type sessions struct {
	secret []byte
	ttl    time.Duration
	now    func() time.Time

	mu      sync.Mutex
	revoked map[string]time.Time // nonce (hex) → the session's expiry
}

// session is a checked session.
type session struct {
	principal string
	nonce     string
	expires   time.Time
}

var errSession = errors.New("no valid session")

func (s *sessions) mac(payload []byte) []byte {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("idemkit-console-session\x00"))
	m.Write(payload)
	return m.Sum(nil)[:macLen]
}

// issue returns a new session's cookie value for principal.
func (s *sessions) issue(principal string) string {
	b := make([]byte, nonceLen+8, nonceLen+8+len(principal))
	_, _ = rand.Read(b[:nonceLen])
	binary.BigEndian.PutUint64(b[nonceLen:], uint64(s.now().Add(s.ttl).Unix()))
	b = append(b, principal...)
	return base64.RawURLEncoding.EncodeToString(b) + "." + base64.RawURLEncoding.EncodeToString(s.mac(b))
}

// check returns the session of a cookie value: signed here, not expired,
// not revoked.
func (s *sessions) check(value string) (session, error) {
	p, m, ok := strings.Cut(value, ".")
	if !ok || len(value) > 4096 {
		return session{}, errSession
	}
	b, err1 := base64.RawURLEncoding.DecodeString(p)
	mac, err2 := base64.RawURLEncoding.DecodeString(m)
	if err1 != nil || err2 != nil || len(b) <= nonceLen+8 || !hmac.Equal(mac, s.mac(b)) {
		return session{}, errSession
	}
	ss := session{principal: string(b[nonceLen+8:]), nonce: hex.EncodeToString(b[:nonceLen]),
		expires: time.Unix(int64(binary.BigEndian.Uint64(b[nonceLen:])), 0)}
	if !s.now().Before(ss.expires) {
		return session{}, errSession
	}
	s.mu.Lock()
	_, gone := s.revoked[ss.nonce]
	s.mu.Unlock()
	if gone {
		return session{}, errSession
	}
	return ss, nil
}

// revoke ends ss: its cookie is refused from now on.
func (s *sessions) revoke(ss session) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, exp := range s.revoked {
		if !now.Before(exp) {
			delete(s.revoked, n)
		}
	}
	s.revoked[ss.nonce] = ss.expires
}

// cookieName is the sign-in cookie's name: its own per console (derived
// from the secret and BasePath), so that two consoles on one host name
// (cookies ignore ports) neither see nor overwrite each other's. A Secure
// cookie takes the __Host- prefix: the browser then keeps it for this
// origin only, over https, with Path=/.
func (c *Console) cookieName(secure bool) string {
	m := hmac.New(sha256.New, c.forms.secret)
	m.Write([]byte("idemkit-console-cookie\x00" + c.cfg.BasePath))
	name := "idemkit_console_" + hex.EncodeToString(m.Sum(nil)[:4])
	if secure {
		return "__Host-" + name
	}
	return name
}

// cookie is the sign-in cookie holding value (empty: the one that clears
// it).
func (c *Console) cookie(r *http.Request, value string) *http.Cookie {
	secure := c.secure(r)
	ck := &http.Cookie{Name: c.cookieName(secure), Value: value, Path: c.cfg.BasePath + "/", HttpOnly: true,
		Secure: secure, SameSite: http.SameSiteStrictMode, MaxAge: int(c.sessions.ttl / time.Second)}
	if secure {
		ck.Path = "/"
	}
	if value == "" {
		ck.MaxAge = -1
	}
	return ck
}

// session returns the session r's sign-in cookie holds, under either name.
func (c *Console) session(r *http.Request) (session, bool) {
	for _, secure := range []bool{true, false} {
		for _, ck := range r.CookiesNamed(c.cookieName(secure)) {
			if ss, err := c.sessions.check(ck.Value); err == nil {
				return ss, true
			}
		}
	}
	return session{}, false
}
