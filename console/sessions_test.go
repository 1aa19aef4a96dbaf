package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The sign-in cookie holds a session, never the token: cookies ignore
// ports, so every server on the host name would receive a token kept
// there. The session expires, is refused once signed out, altered or
// signed by another console, and each console names its own cookie.
func TestSignInCookieIsASignedSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	res := e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "")
	if res.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", res.status)
	}
	c := (&http.Response{Header: res.header}).Cookies()
	if len(c) != 1 {
		t.Fatalf("cookies: %v", c)
	}
	if strings.Contains(c[0].Value, testToken) {
		t.Errorf("the session cookie %s holds the token (%q)", c[0].Name, c[0].Value)
	}
	// Sign-out ends the session: a copy of its cookie is refused after it.
	cookie := c[0].Name + "=" + c[0].Value
	if r := e.req("POST", "/logout", nil, "Authorization", "", "Cookie", cookie); r.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", r.status)
	}
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", cookie); r.status == http.StatusOK {
		t.Errorf("a cookie captured before sign-out still signs in after it")
	}
	// A session expires whatever the browser keeps; one signed by another
	// console, or altered, is refused; each console names its own cookie.
	res = e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "")
	c = (&http.Response{Header: res.header}).Cookies()
	if len(c) != 1 || !strings.HasPrefix(c[0].Name, "idemkit_console_") || c[0].MaxAge != int(SessionTTLDefault/time.Second) {
		t.Fatalf("cookie %+v", c)
	}
	cookie = c[0].Name + "=" + c[0].Value
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", cookie); r.status != http.StatusOK {
		t.Fatalf("with the session: %d", r.status)
	}
	e.console.sessions.now = func() time.Time { return time.Now().Add(SessionTTLDefault + time.Minute) }
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", cookie); r.status != http.StatusUnauthorized {
		t.Errorf("an expired session: %d", r.status)
	}
	e.console.sessions.now = time.Now
	other := newEnv(t, nil)
	if other.console.cookieName(false) == e.console.cookieName(false) {
		t.Errorf("two consoles share the cookie name %s", c[0].Name)
	}
	if r := other.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", other.console.cookieName(false)+"="+c[0].Value); r.status != http.StatusUnauthorized {
		t.Errorf("another console's session: %d", r.status)
	}
	v := []byte(c[0].Value)
	v[3] ^= 1
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", c[0].Name+"="+string(v)); r.status != http.StatusUnauthorized {
		t.Errorf("an altered session: %d", r.status)
	}
	// Over https: a __Host- cookie for the whole origin.
	res = e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "", "X-Forwarded-Proto", "https")
	c = (&http.Response{Header: res.header}).Cookies()
	if len(c) != 1 || c[0].Name != "__Host-"+e.console.cookieName(false) || c[0].Path != "/" || !c[0].Secure {
		t.Errorf("cookie over https: %q", res.header.Get("Set-Cookie"))
	}
}

// The sign-in cookie is Secure over https, also when a proxy terminates TLS
// (X-Forwarded-Proto), and whatever the request says with
// Config.SecureCookie.
func TestSignInCookieSecureOverHTTPS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	res := e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "", "X-Forwarded-Proto", "https")
	c := (&http.Response{Header: res.header}).Cookies()
	if res.status != http.StatusSeeOther || len(c) != 1 {
		t.Fatalf("sign-in: %d %v", res.status, c)
	}
	if !c[0].Secure {
		t.Errorf("sign-in over https (TLS terminated by a proxy): cookie %q without Secure", res.header.Get("Set-Cookie"))
	}
	// Config.SecureCookie: Secure whatever the request says.
	f := newEnv(t, func(c *Config) { c.SecureCookie = true })
	res = f.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "")
	if c := (&http.Response{Header: res.header}).Cookies(); res.status != http.StatusSeeOther || len(c) != 1 || !c[0].Secure {
		t.Errorf("sign-in with SecureCookie: %d %q", res.status, res.header.Get("Set-Cookie"))
	}
}
