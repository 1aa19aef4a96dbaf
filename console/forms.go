package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"
)

// forms issues and checks the tokens of the console's forms. A token is a
// random nonce, the time it was issued and an HMAC over both, the
// principal it was issued to and the action it is for: a page of another
// site cannot make one (CSRF), and one issued to someone else, for another
// form, or too long ago is refused. A replay's action names its selection,
// and only its dry run issues it: a replay runs from its dry run's confirm
// form, never from another form's token. The nonce is the form's key: the
// audit table holds it once, so that a form submitted twice acts once.
type forms struct {
	secret []byte
	ttl    time.Duration
	now    func() time.Time
}

const (
	nonceLen = 16
	macLen   = 16
)

// Errors of forms.check.
var (
	errFormMissing = errors.New("the form carries no token (forms are valid only as the console renders them)")
	errFormInvalid = errors.New("the form's token is not valid for you and this form (a replay runs only from its dry run's confirm form)")
	errFormExpired = errors.New("the form has expired")
)

func (f *forms) mac(principal, action string, nonce []byte, issued int64) []byte {
	m := hmac.New(sha256.New, f.secret)
	m.Write([]byte("idemkit-console-form\x00"))
	for _, s := range []string{principal, action} {
		m.Write([]byte(s))
		m.Write([]byte{0})
	}
	m.Write(nonce)
	_ = binary.Write(m, binary.BigEndian, issued)
	return m.Sum(nil)[:macLen]
}

// issue returns a new token of action for principal.
func (f *forms) issue(principal, action string) string {
	b := make([]byte, nonceLen+8, nonceLen+8+macLen)
	_, _ = rand.Read(b[:nonceLen])
	issued := f.now().Unix()
	binary.BigEndian.PutUint64(b[nonceLen:], uint64(issued))
	b = append(b, f.mac(principal, action, b[:nonceLen], issued)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// check returns the form's key (its nonce, in hex) when token was issued to
// principal for action within the TTL.
func (f *forms) check(token, principal, action string) (string, error) {
	if token == "" {
		return "", errFormMissing
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) != nonceLen+8+macLen {
		return "", errFormInvalid
	}
	issued := int64(binary.BigEndian.Uint64(b[nonceLen:]))
	if action == "" || !hmac.Equal(b[nonceLen+8:], f.mac(principal, action, b[:nonceLen], issued)) {
		return "", errFormInvalid
	}
	age := f.now().Sub(time.Unix(issued, 0))
	if age > f.ttl || age < -time.Minute {
		return "", errFormExpired
	}
	return hex.EncodeToString(b[:nonceLen]), nil
}

// TokenAuth returns an Authorize function that admits the requests
// carrying token as "Authorization: Bearer TOKEN" (JSON clients, and the
// sign-in page's check of the token it is given): every such request is
// the principal name. A browser signs in once with the token and then
// carries a session, not the token (see Config.SessionTTL). token should
// be long and random: the standalone command draws 32 bytes, and refuses a
// chosen one shorter than 32 characters. An empty token admits nobody.
func TokenAuth(token, name string) func(*http.Request) (Principal, error) {
	want := sha256.Sum256([]byte(token))
	return func(r *http.Request) (Principal, error) {
		got, _ := cutBearer(r.Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(got))
		if token == "" || got == "" || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			return Principal{}, ErrUnauthorized
		}
		return Principal{Name: name}, nil
	}
}

func cutBearer(h string) (string, bool) {
	if len(h) > 7 && (h[:7] == "Bearer " || h[:7] == "bearer ") {
		return h[7:], true
	}
	return "", false
}

// loginData is the sign-in page's content.
type loginData struct {
	Error string `json:"error,omitempty"`
}

// unauthorized sends a browser to the sign-in page (a GET), and answers
// 401 otherwise.
func (c *Console) unauthorized(w http.ResponseWriter, r *http.Request, rq *request) {
	switch {
	case rq.json:
		c.render(w, rq, http.StatusUnauthorized, "error", "Sign in",
			errorData{Status: http.StatusUnauthorized, Error: "not signed in: send Authorization: Bearer TOKEN"})
	case r.Method == http.MethodGet:
		http.Redirect(w, r, c.cfg.BasePath+"/login", http.StatusSeeOther)
	default:
		c.render(w, rq, http.StatusUnauthorized, "login", "Sign in", loginData{Error: "Sign in first: nothing was changed."})
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, &request{}, http.StatusOK, "login", "Sign in", loginData{})
}

// login checks the token it is given with Authorize (as "Authorization:
// Bearer TOKEN") and, when it admits it, opens a session: the cookie holds
// the session, never the token. A wrong token signs nobody in.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
	token := r.PostFormValue("token")
	probe := r.Clone(r.Context())
	probe.Header = r.Header.Clone()
	probe.Header.Del("Cookie")
	probe.Header.Set("Authorization", "Bearer "+token)
	p, err := c.cfg.Authorize(probe)
	if err != nil || token == "" || p.Name == "" {
		c.log.Warn("console: sign-in refused", "remote_addr", remoteAddr(r))
		c.render(w, &request{}, http.StatusUnauthorized, "login", "Sign in", loginData{Error: "That token is not valid."})
		return
	}
	http.SetCookie(w, c.cookie(r, c.sessions.issue(p.Name)))
	http.Redirect(w, r, c.cfg.BasePath+"/", http.StatusSeeOther)
}

// secure reports whether the sign-in cookie is marked Secure: by
// Config.SecureCookie, or for a request that came over https (to the
// server, or to a proxy that says so). A client that claims https where
// there is none only keeps its own cookie from plain http.
func (c *Console) secure(r *http.Request) bool {
	return c.cfg.SecureCookie || r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// logout ends the request's session, server-side (a copy of its cookie is
// refused too), and clears the cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if ss, ok := c.session(r); ok {
		c.sessions.revoke(ss)
	}
	http.SetCookie(w, c.cookie(r, ""))
	http.Redirect(w, r, c.cfg.BasePath+"/login", http.StatusSeeOther)
}
