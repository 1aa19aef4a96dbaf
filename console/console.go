package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/redact"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/monitor"
	"github.com/idemkit/idemkit/outbox"
)

// ErrInvalidConfig is wrapped by every configuration error of New.
var ErrInvalidConfig = fmt.Errorf("console: %w", idemkit.ErrInvalidConfig)

// ErrUnauthorized is what an Authorize function returns for a request
// without valid credentials: the console answers 401 with its login page.
// Any other error is answered 403.
var ErrUnauthorized = errors.New("console: not signed in")

// Defaults of Config.
const (
	// FormTTLDefault is how long a form stays valid after it was rendered.
	FormTTLDefault = time.Hour
	// PageSizeDefault is how many dead letters a page lists.
	PageSizeDefault = 50
	// PageSizeMax is the most dead letters a page lists; a larger size is
	// refused.
	PageSizeMax = 500
	// ReplaySelectionMax bounds the letters one replay of a selection names.
	ReplaySelectionMax = 100
	// ActionTimeout bounds an action (a replay, a retry, a reveal) once its
	// form is accepted. The action runs to its end or to this bound even
	// when the client goes away: a confirmed replay is not cut half-way by
	// a closed tab.
	ActionTimeout = 2 * time.Minute
)

// Principal is who a request comes from, as Authorize says.
type Principal struct {
	// Name is written in the audit table and as the replays' ReplayedBy.
	Name string
}

// Thresholds are the limits the overview checks, those of idemkit status.
// A negative value is not checked.
type Thresholds struct {
	// MaxLag is the most lag of a consumer on a topic. Defaults to 10000.
	MaxLag int64
	// MaxParkedAge is the age of the oldest parked consumer message.
	// Defaults to 1h.
	MaxParkedAge time.Duration
	// MaxOutboxAge is the age of the oldest unpublished outbox message.
	// Defaults to 5m.
	MaxOutboxAge time.Duration
	// MaxStuck is the most HTTP idempotency records stuck in flight.
	// Defaults to 0: any stuck record crosses it.
	MaxStuck int64
	// MaxDLQ is the most unresolved origin messages of a dead-letter topic.
	// Defaults to 0: not checked (idemkit status -max-dlq -1).
	MaxDLQ int64
	// Retention is the consumers' dedup retention: an oldest record older
	// than 1.25 × it crosses. Defaults to 0: not checked.
	Retention time.Duration
}

// Config configures a console. Kafka.Brokers and Authorize are required.
type Config struct {
	// Kafka is how to reach the cluster (see package kafkaconn).
	Kafka kafkaconn.Config
	// Tables says where idemkit's tables live (the zero value: schema
	// "public", every default name), the audit table included.
	Tables migrate.Tables
	// Authorize says who a request comes from. Required: the console has
	// no anonymous access. Return an error wrapping ErrUnauthorized for a
	// request without credentials (the console shows its sign-in page),
	// any other error to refuse it (403). TokenAuth is one.
	Authorize func(*http.Request) (Principal, error)
	// ReadOnly hides every action and refuses every POST but sign-in.
	// Defaults to false.
	ReadOnly bool
	// BasePath is where the handler is mounted in the service's mux
	// ("/console"): a clean path without a trailing slash. Mount the
	// handler on BasePath+"/" without stripping it: the console's links and
	// redirects stay within it, and it answers 404 outside it. Defaults to
	// "": the root.
	BasePath string
	// DLQSuffix names the dead-letter topics: the topics whose name ends
	// with it. Defaults to dlq.TopicSuffixDefault (".dlq").
	DLQSuffix string
	// DLQTopics are more dead-letter topics (the destinations of
	// dlq.WriterConfig.Routes). Defaults to none.
	DLQTopics []string
	// Redrive maps a dead-letter topic to the consumer's handler: its
	// replays run the handler in process (dlq.Redrive) instead of writing
	// the messages back to their origin topic (dlq.Republish, as idemkit
	// dlq replay does). Defaults to none: every topic republishes.
	Redrive map[string]consumer.Handler
	// Thresholds are the overview's limits.
	Thresholds Thresholds
	// FormTTL is how long a rendered form may be submitted. Defaults to
	// FormTTLDefault.
	FormTTL time.Duration
	// SessionTTL is how long a sign-in lasts. Defaults to
	// SessionTTLDefault.
	SessionTTL time.Duration
	// Secret signs the forms' tokens and the sessions (at least 32 bytes):
	// give every instance behind one load balancer the same. Defaults to
	// random bytes per process: forms rendered and sessions opened before
	// a restart are refused after it.
	Secret []byte
	// RedactFields are more names whose values are masked whole, and
	// RedactRegexps more patterns to mask (as idemkit's -redact-fields and
	// -redact-regexp). Defaults to none.
	RedactFields  []string
	RedactRegexps []*regexp.Regexp
	// SecureCookie marks the sign-in cookie Secure (sent over https only).
	// It is Secure anyway when the request came over TLS, or through a
	// proxy that says so (X-Forwarded-Proto: https). Set it when the
	// console is served over https, behind a proxy that terminates TLS.
	// Defaults to false.
	SecureCookie bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Console is the web console: an http.Handler.
type Console struct {
	pool     *pgxpool.Pool
	cfg      Config
	tables   migrate.Tables
	monitor  *monitor.Monitor
	outbox   *outbox.Store
	idem     *idemhttp.Store
	dedup    *dedup.Store
	audit    *auditLog
	forms    *forms
	sessions *sessions
	red      *redact.Redactor
	reveal   *redact.Redactor
	pages    map[string]*template.Template
	client   *kafka.Client
	closeK   func()
	mux      *http.ServeMux
	crossOrg *http.CrossOriginProtection
	log      *slog.Logger
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New validates cfg and returns the console for the tables in pool. It does
// not connect.
func New(pool *pgxpool.Pool, cfg *Config) (*Console, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	case cfg == nil:
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	case cfg.Authorize == nil:
		return nil, fmt.Errorf("%w: Authorize is required: the console has no anonymous access", ErrInvalidConfig)
	case cfg.FormTTL < 0 || cfg.SessionTTL < 0:
		return nil, fmt.Errorf("%w: FormTTL and SessionTTL must not be negative", ErrInvalidConfig)
	case cfg.Secret != nil && len(cfg.Secret) < 32:
		return nil, fmt.Errorf("%w: Secret must hold at least 32 bytes", ErrInvalidConfig)
	case cfg.BasePath != "" && (!strings.HasPrefix(cfg.BasePath, "/") || strings.HasSuffix(cfg.BasePath, "/") ||
		path.Clean(cfg.BasePath) != cfg.BasePath ||
		strings.ContainsAny(cfg.BasePath, "{}% \t")):
		return nil, fmt.Errorf("%w: BasePath %q must be a clean path that starts with / and does not end with one, "+
			"without braces, spaces or escapes", ErrInvalidConfig, cfg.BasePath)
	}
	if err := cfg.Kafka.Validate(); err != nil {
		return nil, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	c := &Console{pool: pool, cfg: *cfg, tables: cfg.Tables.WithDefaults()}
	c.cfg.DLQSuffix = cmp.Or(c.cfg.DLQSuffix, dlq.TopicSuffixDefault)
	c.cfg.FormTTL = cmp.Or(c.cfg.FormTTL, FormTTLDefault)
	c.cfg.SessionTTL = cmp.Or(c.cfg.SessionTTL, SessionTTLDefault)
	c.cfg.Thresholds = c.cfg.Thresholds.withDefaults()
	c.log = cmp.Or(c.cfg.Logger, slog.Default())
	if err := c.tables.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	secret := c.cfg.Secret
	if secret == nil {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, fmt.Errorf("console: secret: %w", err)
		}
	}
	c.forms = &forms{secret: secret, ttl: c.cfg.FormTTL, now: time.Now}
	c.sessions = &sessions{secret: secret, ttl: c.cfg.SessionTTL, now: time.Now, revoked: map[string]time.Time{}}
	var err error
	if c.monitor, err = monitor.New(&monitor.Config{Kafka: c.cfg.Kafka, Tables: c.tables}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.outbox, err = outbox.New(&outbox.Config{Tables: c.tables}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.idem, err = idemhttp.NewStore(&idemhttp.StoreConfig{Tables: c.tables}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.dedup, err = dedup.New(&dedup.Config{Tables: c.tables}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	t, err := c.cfg.Kafka.Transport()
	if err != nil {
		return nil, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	c.client = &kafka.Client{Addr: c.cfg.Kafka.Addr(), Timeout: 10 * time.Second, Transport: t}
	c.closeK = t.CloseIdleConnections
	c.audit = newAuditLog(c.tables)
	c.red = redact.New(c.cfg.RedactFields, c.cfg.RedactRegexps)
	c.reveal = &redact.Redactor{Show: true}
	if c.pages, err = parsePages(); err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	c.crossOrg = http.NewCrossOriginProtection()
	c.routes()
	return c, nil
}

// Close closes the console's idle Kafka connections.
func (c *Console) Close() {
	c.monitor.Close()
	c.closeK()
}

func (t Thresholds) withDefaults() Thresholds {
	t.MaxLag = cmp.Or(t.MaxLag, 10000)
	t.MaxParkedAge = cmp.Or(t.MaxParkedAge, time.Hour)
	t.MaxOutboxAge = cmp.Or(t.MaxOutboxAge, 5*time.Minute)
	if t.MaxDLQ == 0 {
		t.MaxDLQ = -1
	}
	return t
}

func (c *Console) routes() {
	// The patterns hold BasePath, so that the mux's own redirects (path
	// cleaning, a subtree without its slash) stay within it.
	m, b := http.NewServeMux(), c.cfg.BasePath
	static, _ := fs.Sub(staticFS, "static")
	m.Handle("GET "+b+"/static/", http.StripPrefix(b+"/static/", staticFiles(static)))
	m.HandleFunc("GET "+b+"/login", c.loginPage)
	m.HandleFunc("POST "+b+"/login", c.login)
	m.HandleFunc("POST "+b+"/logout", c.logout)
	m.HandleFunc("GET "+b+"/{$}", c.authed(c.overviewPage))
	m.HandleFunc("GET "+b+"/dlq/{topic}", c.authed(c.lettersPage))
	m.HandleFunc("GET "+b+"/dlq/{topic}/{partition}/{offset}", c.authed(c.letterPage))
	m.HandleFunc("POST "+b+"/dlq/{topic}/{partition}/{offset}/reveal", c.action(bindReveal, c.revealLetter))
	m.HandleFunc("POST "+b+"/dlq/{topic}/replay/dry-run", c.action(named(actDryRun), c.replayDryRun))
	m.HandleFunc("POST "+b+"/dlq/{topic}/replay", c.action(c.replayAction, c.replay))
	m.HandleFunc("GET "+b+"/outbox", c.authed(c.outboxPage))
	m.HandleFunc("POST "+b+"/outbox/retry", c.action(bindOutboxRetry, c.outboxRetry))
	m.HandleFunc("GET "+b+"/consumers", c.authed(c.consumersPage))
	m.HandleFunc("GET "+b+"/consumers/{name}/{topic}", c.authed(c.consumerPage))
	m.HandleFunc("POST "+b+"/consumers/{name}/{topic}/retry", c.action(bindParkedRetry, c.parkedRetry))
	m.HandleFunc("GET "+b+"/idemhttp", c.authed(c.idemhttpPage))
	m.HandleFunc("POST "+b+"/idemhttp/resolve", c.action(bindResolve, c.idemhttpResolve))
	m.HandleFunc("GET "+b+"/audit", c.authed(c.auditPage))
	m.HandleFunc(b+"/", c.authed(func(w http.ResponseWriter, r *http.Request, rq *request) {
		c.fail(w, r, rq, http.StatusNotFound, "no such page: "+r.URL.Path)
	}))
	c.mux = m
}

// staticFiles serves the files of fsys, and answers 404 for a directory:
// no listing.
func staticFiles(fsys fs.FS) http.Handler {
	files := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st, err := fs.Stat(fsys, cmp.Or(strings.TrimSuffix(r.URL.Path, "/"), ".")); err != nil || st.IsDir() {
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
}

// ServeHTTP serves the console: every response carries strict headers, every
// page but sign-in and the static files needs Authorize's approval.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'none'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if b := c.cfg.BasePath; b != "" {
		// Not the console's: a path outside BasePath, or one that cleans to
		// outside it (the mux would redirect there).
		if p := path.Clean(r.URL.Path); p != b && !strings.HasPrefix(p, b+"/") {
			http.NotFound(w, r)
			return
		}
	}
	if !strings.HasPrefix(r.URL.Path, c.cfg.BasePath+"/static/") {
		h.Set("Cache-Control", "no-store") // pages may hold payloads
	}
	if err := c.crossOrg.Check(r); err != nil {
		c.fail(w, r, &request{}, http.StatusForbidden, "cross-origin request refused: "+err.Error())
		return
	}
	c.mux.ServeHTTP(w, r)
}

// request is what a page knows of the request it serves.
type request struct {
	principal Principal
	json      bool
}

// wantsJSON reports whether r asks for JSON: ?format=json or an Accept
// header that names application/json before text/html.
func wantsJSON(r *http.Request) bool {
	if f := r.URL.Query().Get("format"); f != "" {
		return f == "json"
	}
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt := strings.TrimSpace(strings.SplitN(part, ";", 2)[0])
		switch mt {
		case "application/json":
			return true
		case "text/html", "*/*":
			return false
		}
	}
	return false
}

// authed runs page for an authorized request.
func (c *Console) authed(page func(http.ResponseWriter, *http.Request, *request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rq := &request{json: wantsJSON(r)}
		p, err := c.cfg.Authorize(r)
		if errors.Is(err, ErrUnauthorized) {
			if ss, ok := c.session(r); ok {
				p, err = Principal{Name: ss.principal}, nil
			}
		}
		switch {
		case errors.Is(err, ErrUnauthorized):
			c.unauthorized(w, r, rq)
			return
		case err != nil:
			c.fail(w, r, rq, http.StatusForbidden, "refused: "+err.Error())
			return
		case p.Name == "":
			c.fail(w, r, rq, http.StatusForbidden, "refused: Authorize returned a principal without a name")
			return
		}
		rq.principal = p
		page(w, r, rq)
	}
}

// The actions a form token is issued for (see forms). A replay's is
// replayAction's: it names the selection.
const (
	actReveal      = "dlq.reveal"
	actDryRun      = "dlq.dry-run"
	actOutboxRetry = "outbox.retry"
	actParkedRetry = "consumer.parked.retry"
	actResolve     = "idemhttp.resolve"
)

// named is the binding of a form whose token names action only.
func named(action string) func(*http.Request) string {
	return func(*http.Request) string { return action }
}

// targeted names an action on one target (a letter, a message, a key, a
// record): what the token of a form that acts on it is bound to, so that
// it submits no other form, on no other target.
func targeted(action string, target ...any) string {
	var b strings.Builder
	b.WriteString(action)
	for _, t := range target {
		b.WriteByte(0x1f)
		fmt.Fprint(&b, t)
	}
	return b.String()
}

// The bindings of the forms that act on one target, read from the request
// as the handlers read it.
func bindReveal(r *http.Request) string {
	return targeted(actReveal, r.PathValue("topic"), r.PathValue("partition"), r.PathValue("offset"))
}

func bindOutboxRetry(r *http.Request) string { return targeted(actOutboxRetry, r.PostFormValue("id")) }

func bindParkedRetry(r *http.Request) string {
	if r.PostFormValue("all") == "1" {
		return targeted(actParkedRetry, r.PathValue("name"), r.PathValue("topic"), "all")
	}
	return targeted(actParkedRetry, r.PathValue("name"), r.PathValue("topic"), r.PostFormValue("partition"),
		r.PostFormValue("key_id"))
}

func bindResolve(r *http.Request) string {
	return targeted(actResolve, r.PostFormValue("account"), r.PostFormValue("operation"), r.PostFormValue("key"),
		r.PostFormValue("token"))
}

// action runs act for an authorized POST with a valid form token, unless
// the console is read-only; act gets the form's key (see forms). bind says
// the action the token must have been issued for, from the parsed form.
func (c *Console) action(bind func(*http.Request) string, act func(http.ResponseWriter, *http.Request, *request, string)) http.HandlerFunc {
	return c.authed(func(w http.ResponseWriter, r *http.Request, rq *request) {
		if c.cfg.ReadOnly {
			c.fail(w, r, rq, http.StatusForbidden, "the console is read-only: no action is taken")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, rq, http.StatusBadRequest, "unreadable form: "+err.Error())
			return
		}
		key, err := c.forms.check(r.PostFormValue("csrf"), rq.principal.Name, bind(r))
		if err != nil {
			c.fail(w, r, rq, http.StatusForbidden, err.Error()+": nothing was changed; reload the page and submit the form again")
			return
		}
		act(w, r, rq, key)
	})
}

// remoteAddr is the address a request came from, as the server saw it.
func remoteAddr(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// page is what every template gets.
type page struct {
	c         *Console
	Title     string
	Nav       string
	Principal string
	ReadOnly  bool
	Base      string
	Data      any
	Error     string
}

// Token returns a fresh form token of action for the page's principal:
// each form gets its own, the key that makes submitting it twice act once.
func (p *page) Token(action string) string { return p.c.forms.issue(p.Principal, action) }

// TokenFor is the form token for action on one target (see targeted).
func (p *page) TokenFor(action string, target ...any) string {
	return p.c.forms.issue(p.Principal, targeted(action, target...))
}

// render writes data as the page named name, or as JSON.
func (c *Console) render(w http.ResponseWriter, rq *request, status int, name, title string, data any) {
	if rq.json {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(status)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(data); err != nil {
			c.log.Warn("console: write JSON", "err", err)
		}
		return
	}
	t := c.pages[name]
	p := &page{c: c, Title: title, Nav: name, Principal: rq.principal.Name, ReadOnly: c.cfg.ReadOnly,
		Base: c.cfg.BasePath, Data: data}
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout", p); err != nil {
		c.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "console: render "+name+": internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// errorData is an error page's content.
type errorData struct {
	Status int    `json:"status"`
	Error  string `json:"error"`
}

// fail answers with an error page (or JSON) that says msg; nothing was
// changed.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, rq *request, status int, msg string) {
	if rq.json || wantsJSON(r) {
		rq.json = true
	}
	c.render(w, rq, status, "error", http.StatusText(status), errorData{Status: status, Error: msg})
}

// failErr answers with an error page for err, its status from its kind.
func (c *Console) failErr(w http.ResponseWriter, r *http.Request, rq *request, what string, err error) {
	status := http.StatusInternalServerError
	var bad *badInput
	switch {
	case errors.As(err, &bad):
		status = http.StatusBadRequest
	case errors.Is(err, dlq.ErrNoTopic), errors.Is(err, errNotFound):
		status = http.StatusNotFound
	case errors.Is(err, r.Context().Err()) && r.Context().Err() != nil:
		return // the client went away
	default:
		c.log.Error("console: "+what, "err", err)
	}
	c.fail(w, r, rq, status, what+": "+err.Error())
}

// errNotFound marks what the request names but does not exist.
var errNotFound = errors.New("not found")

// badInput is a request's malformed parameter.
type badInput struct{ msg string }

func (e *badInput) Error() string { return e.msg }

func badf(format string, args ...any) error { return &badInput{fmt.Sprintf(format, args...)} }

// isDeadLetterTopic reports whether topic is one the console lists: named
// with the suffix, or in DLQTopics.
func (c *Console) isDeadLetterTopic(topic string) bool {
	return topic != "" && (strings.HasSuffix(topic, c.cfg.DLQSuffix) || slices.Contains(c.cfg.DLQTopics, topic))
}

// ctxTimeout bounds the reads of one page.
func ctxTimeout(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 2*time.Minute)
}
