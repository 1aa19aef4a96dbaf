package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/redact"
)

// letterFilter selects dead letters: a dlq.Filter and the form it came
// from.
type letterFilter struct {
	Origin    string `json:"origin,omitempty"`
	Class     string `json:"class,omitempty"`
	MessageID string `json:"message_id,omitempty"`
	Error     string `json:"error,omitempty"`
	Since     string `json:"since,omitempty"`
	Until     string `json:"until,omitempty"`
	f         dlq.Filter
}

// timeLayouts are the time forms a filter takes: RFC 3339, and the form
// of an HTML datetime-local input (UTC).
var timeLayouts = []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04"}

func parseTime(name, v string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, badf("%s: %q is not a time: want RFC 3339 (2026-11-30T08:00:00Z) or 2026-11-30T08:00 (UTC)", name, v)
}

func parseFilter(v url.Values) (letterFilter, error) {
	lf := letterFilter{Origin: strings.TrimSpace(v.Get("origin")), Class: strings.TrimSpace(v.Get("class")),
		MessageID: strings.TrimSpace(v.Get("message_id")), Error: v.Get("error"),
		Since: strings.TrimSpace(v.Get("since")), Until: strings.TrimSpace(v.Get("until"))}
	for _, s := range []string{lf.Origin, lf.Class, lf.MessageID, lf.Error} {
		if len(s) > 1000 {
			return lf, badf("a filter field is longer than 1000 characters")
		}
	}
	lf.f = dlq.Filter{OriginTopic: lf.Origin, ErrorContains: lf.Error, Class: lf.Class}
	if lf.MessageID != "" {
		lf.f.MessageIDs = []string{lf.MessageID}
	}
	var err error
	if lf.Since != "" {
		if lf.f.Since, err = parseTime("since", lf.Since); err != nil {
			return lf, err
		}
	}
	if lf.Until != "" {
		if lf.f.Until, err = parseTime("until", lf.Until); err != nil {
			return lf, err
		}
	}
	if !lf.f.Since.IsZero() && !lf.f.Until.IsZero() && !lf.f.Since.Before(lf.f.Until) {
		return lf, badf("since (%s) must be before until (%s)", lf.Since, lf.Until)
	}
	return lf, nil
}

// Values are the filter as query parameters.
func (lf letterFilter) Values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"origin": lf.Origin, "class": lf.Class, "message_id": lf.MessageID,
		"error": lf.Error, "since": lf.Since, "until": lf.Until} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// Fields are the filter as hidden form fields, in a fixed order.
func (lf letterFilter) Fields() [][2]string {
	v := lf.Values()
	var out [][2]string
	for _, k := range slices.Sorted(maps.Keys(v)) {
		out = append(out, [2]string{k, v.Get(k)})
	}
	return out
}

// Empty reports whether the filter selects everything.
func (lf letterFilter) Empty() bool { return len(lf.Values()) == 0 }

// String says the filter in words, for the audit table.
func (lf letterFilter) String() string {
	if lf.Empty() {
		return "every letter"
	}
	return lf.Values().Encode()
}

// letterRow is one dead letter in a list.
type letterRow struct {
	Partition   int        `json:"partition"`
	Offset      int64      `json:"offset"`
	State       dlq.State  `json:"state"`
	MessageID   string     `json:"message_id"`
	Origin      dlq.Origin `json:"origin"`
	Round       int        `json:"round"`
	Class       string     `json:"class"`
	Attempts    int        `json:"attempts"`
	LastFailure time.Time  `json:"last_failure"`
	Error       string     `json:"error"`
}

// lettersData is a dead-letter topic's page.
type lettersData struct {
	Topic  string       `json:"topic"`
	Filter letterFilter `json:"filter"`
	Page   int          `json:"page"`
	Size   int          `json:"size"`
	// Total counts the letters the filter selected; Pages the pages they
	// fill.
	Total   int         `json:"total"`
	Pages   int         `json:"pages"`
	Letters []letterRow `json:"letters"`
	// States counts the selected origin messages per state.
	States     map[dlq.State]int `json:"states"`
	Read       int               `json:"read"`
	Unreadable int               `json:"unreadable"`
	Redacted   bool              `json:"redacted"`
	Notes      []string          `json:"notes"`
}

// StatesText says the counts per state.
func (d *lettersData) StatesText() string { return statesText(d.States) }

// PageLink is the query of page n with the filter.
func (d *lettersData) PageLink(n int) string {
	v := d.Filter.Values()
	v.Set("page", strconv.Itoa(n))
	if d.Size != PageSizeDefault {
		v.Set("size", strconv.Itoa(d.Size))
	}
	return "?" + v.Encode()
}

func atoiParam(v url.Values, name string, def, lo, hi int) (int, error) {
	s := v.Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, badf("%s: want a whole number from %d to %d, not %q", name, lo, hi, s)
	}
	return n, nil
}

// topicOf returns the request's dead-letter topic, refusing a topic that
// is not one.
func (c *Console) topicOf(r *http.Request) (string, error) {
	t := r.PathValue("topic")
	if !c.isDeadLetterTopic(t) {
		return "", fmt.Errorf("%w: %q is not a dead-letter topic (its name does not end with %q and it is not in DLQTopics)",
			errNotFound, t, c.cfg.DLQSuffix)
	}
	return t, nil
}

func (c *Console) lettersPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	d, err := c.letters(ctx, r)
	if err != nil {
		c.failErr(w, r, rq, "list dead letters", err)
		return
	}
	c.render(w, rq, http.StatusOK, "letters", d.Topic, d)
}

// letters lists one page of a topic's dead letters: dlq.List with a
// Window keeps the page's letters, without their key, value or headers
// (the origin's headers are its producer's to choose, and may be large),
// and counts the others as it reads them.
func (c *Console) letters(ctx context.Context, r *http.Request) (*lettersData, error) {
	topic, err := c.topicOf(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	lf, err := parseFilter(q)
	if err != nil {
		return nil, err
	}
	d := &lettersData{Topic: topic, Filter: lf, Letters: []letterRow{}, Notes: []string{}, Redacted: true}
	if d.Size, err = atoiParam(q, "size", PageSizeDefault, 1, PageSizeMax); err != nil {
		return nil, err
	}
	if d.Page, err = atoiParam(q, "page", 1, 1, 1<<30); err != nil {
		return nil, err
	}
	l, noReplays, err := c.list(ctx, &dlq.ListConfig{Topics: []string{topic}, Filter: lf.f, NoPayload: true, DropHeaders: true,
		Window: &dlq.Window{Skip: (d.Page - 1) * d.Size, Limit: d.Size}})
	if err != nil {
		return nil, err
	}
	if noReplays {
		d.Notes = append(d.Notes, noReplaysNote)
	}
	d.Read, d.Unreadable, d.Total, d.States = l.Read, len(l.Unreadable), l.Selected, l.States
	for _, m := range l.Messages {
		for _, x := range m.Letters {
			d.Letters = append(d.Letters, c.letterRow(x))
		}
	}
	d.Pages = max(1, (d.Total+d.Size-1)/d.Size)
	return d, nil
}

func (c *Console) letterRow(x dlq.Letter) letterRow {
	last := x.Last()
	return letterRow{Partition: x.Message.Partition, Offset: x.Message.Offset, State: x.State, MessageID: x.MessageID,
		Origin: x.Origin, Round: x.Round, Class: last.Class, Attempts: last.Attempts, LastFailure: last.LastFailure.UTC(),
		Error: c.red.Text(last.Error)}
}

// header is one message header, its value redacted unless revealed.
type header struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// letterData is one dead letter's page.
type letterData struct {
	Topic     string      `json:"topic"`
	Partition int         `json:"partition"`
	Offset    int64       `json:"offset"`
	State     dlq.State   `json:"state"`
	Replay    *dlq.Replay `json:"replay"`
	MessageID string      `json:"message_id"`
	Origin    dlq.Origin  `json:"origin"`
	Group     string      `json:"group"`
	Consumer  string      `json:"consumer"`
	Round     int         `json:"round"`
	Key       string      `json:"key"`
	Value     string      `json:"value"`
	// ValueStored is the size of a value kept in PostgreSQL, shown in
	// Value once read from there.
	ValueStored *int          `json:"value_stored,omitempty"`
	Headers     []header      `json:"headers"`
	History     []dlq.Failure `json:"history"`
	// Redacted is false once an operator revealed the payload; the reveal
	// is RevealAuditID in the audit table.
	Redacted      bool  `json:"redacted"`
	RevealAuditID int64 `json:"reveal_audit_id,omitempty"`
}

// errFound ends a scan at the letter looked for.
var errFound = errors.New("found")

// findLetter reads the dead letter at partition/offset of topic.
func (c *Console) findLetter(ctx context.Context, r *http.Request) (string, *dlq.DeadLetter, error) {
	topic, err := c.topicOf(r)
	if err != nil {
		return "", nil, err
	}
	p, err1 := strconv.Atoi(r.PathValue("partition"))
	o, err2 := strconv.ParseInt(r.PathValue("offset"), 10, 64)
	if err1 != nil || err2 != nil || p < 0 || o < 0 {
		return "", nil, badf("want /dlq/TOPIC/PARTITION/OFFSET with whole numbers, not %s/%s", r.PathValue("partition"), r.PathValue("offset"))
	}
	var found *dlq.DeadLetter
	var parseErr error
	err = dlq.Scan(ctx, c.cfg.Kafka, topic, func(m kafka.Message) error {
		if m.Partition != p || m.Offset != o {
			return nil
		}
		found, parseErr = dlq.Parse(m)
		return errFound
	})
	switch {
	case errors.Is(err, errFound) && parseErr != nil:
		return "", nil, fmt.Errorf("%s/%d/%d: %w", topic, p, o, parseErr)
	case errors.Is(err, errFound):
	case err != nil:
		return "", nil, err
	default:
		return "", nil, fmt.Errorf("%w: no dead letter at %s/%d/%d", errNotFound, topic, p, o)
	}
	if err := dlq.LoadValue(ctx, c.pool, c.tables, found); err != nil {
		return "", nil, err
	}
	return topic, found, nil
}

// redactReplay returns a copy of rp with its texts redacted by red: dlq
// records there the handler's error, which may name what the history's
// errors name.
func redactReplay(rp *dlq.Replay, red *redact.Redactor) *dlq.Replay {
	if rp == nil {
		return nil
	}
	out := *rp
	out.Detail, out.ReplayedBy = red.Text(out.Detail), red.Text(out.ReplayedBy)
	return &out
}

// letter is d's page, redacted by red.
func (c *Console) letter(ctx context.Context, topic string, d *dlq.DeadLetter, red *redact.Redactor) (*letterData, error) {
	m := d.Message
	ld := &letterData{Topic: topic, Partition: m.Partition, Offset: m.Offset, MessageID: d.MessageID, Origin: d.Origin,
		Group: d.Group, Consumer: d.Consumer, Round: d.Round, Headers: []header{}, Redacted: !red.Show}
	orig := d.Original()
	ld.Key, ld.Value = red.Bytes(orig.Key), red.Value(orig.Value)
	if d.StoredValue != nil {
		ld.ValueStored = &d.StoredValue.Size
	}
	for _, h := range orig.Headers {
		ld.Headers = append(ld.Headers, header{Key: h.Key, Value: red.Header(h.Key, h.Value)})
	}
	for _, f := range d.History {
		f.Error = red.Text(f.Error)
		ld.History = append(ld.History, f)
	}
	// Its state: from the listing of its message's letters (every round).
	if d.MessageID != "" {
		l, _, err := c.list(ctx, &dlq.ListConfig{Topics: []string{topic}, Filter: dlq.Filter{MessageIDs: []string{d.MessageID}}, NoPayload: true, DropHeaders: true})
		if err != nil {
			return nil, err
		}
		for _, om := range l.Messages {
			for _, x := range om.Letters {
				if x.Message.Partition == m.Partition && x.Message.Offset == m.Offset {
					ld.State, ld.Replay = x.State, redactReplay(x.Replay, red)
				}
			}
		}
	}
	return ld, nil
}

func (c *Console) letterPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	topic, d, err := c.findLetter(ctx, r)
	if err != nil {
		c.failErr(w, r, rq, "read the dead letter", err)
		return
	}
	ld, err := c.letter(ctx, topic, d, c.red)
	if err != nil {
		c.failErr(w, r, rq, "read the dead letter", err)
		return
	}
	c.render(w, rq, http.StatusOK, "letter", fmt.Sprintf("%s %d/%d", topic, ld.Partition, ld.Offset), ld)
}

// revealLetter shows a letter's payload verbatim, once the reveal is in
// the audit table.
func (c *Console) revealLetter(w http.ResponseWriter, r *http.Request, rq *request, key string) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	topic, d, err := c.findLetter(ctx, r)
	if err != nil {
		c.failErr(w, r, rq, "read the dead letter", err)
		return
	}
	target := fmt.Sprintf("%s/%d/%d", topic, d.Message.Partition, d.Message.Offset)
	res, err := c.act(r, rq, key, "dlq.reveal", target, func(context.Context) (string, error) {
		return "payload shown verbatim", nil
	})
	if err != nil {
		c.failErr(w, r, rq, "audit the reveal", err)
		return
	}
	if res.Duplicate {
		c.fail(w, r, rq, http.StatusConflict, "this reveal form was submitted before (audit entry "+
			strconv.FormatInt(res.AuditID, 10)+"): reveal again from the letter's page")
		return
	}
	ld, err := c.letter(ctx, topic, d, c.reveal)
	if err != nil {
		c.failErr(w, r, rq, "read the dead letter", err)
		return
	}
	ld.RevealAuditID = res.AuditID
	c.render(w, rq, http.StatusOK, "letter", target+" (revealed)", ld)
}

// replayData is a replay's page: its dry run, or what it did.
type replayData struct {
	Topic  string       `json:"topic"`
	Mode   string       `json:"mode"`
	DryRun bool         `json:"dry_run"`
	Filter letterFilter `json:"filter"`
	// IDs are the selected message IDs; empty when the filter selects.
	IDs     []string     `json:"message_ids"`
	Items   []replayItem `json:"dead_letters"`
	Records dlq.Counts   `json:"records"`
	// Messages counts origin messages (dlq.Summary.Messages).
	Messages dlq.Counts `json:"messages"`
	// ConfirmToken is a dry run's token for its confirm form: the csrf of
	// the replay of the same selection (scope "selected" with the IDs when
	// IDs is set, else "filtered" with the filter). Empty when there is
	// nothing to confirm, or the console is read-only.
	ConfirmToken string `json:"confirm_token,omitempty"`
	// Result is what the replay did: nil in a dry run.
	Result *actResult `json:"result,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// RecordsText and MessagesText say the counts.
func (d *replayData) RecordsText() string  { return countsText(d.Records) }
func (d *replayData) MessagesText() string { return countsText(d.Messages) }

// replayItem is one dead letter and what a replay did with it (or would).
type replayItem struct {
	Action    dlq.Action `json:"action"`
	Partition int        `json:"partition"`
	Offset    int64      `json:"offset"`
	MessageID string     `json:"message_id"`
	Origin    string     `json:"origin"`
	Error     string     `json:"error,omitempty"`
}

// replayOrder is the order in which counts are said.
var replayOrder = []dlq.Action{dlq.Applied, dlq.Republished, dlq.RepublishedNoID, dlq.WouldReplay, dlq.AlreadyApplied,
	dlq.AlreadyReplayed, dlq.FailedAgain, dlq.Exhausted, dlq.NoMessageID, dlq.BeyondHorizon, dlq.WriteFailed,
	dlq.ValueNotFound, dlq.Unreadable}

func countsText(n dlq.Counts) string {
	var parts []string
	for _, a := range replayOrder {
		if n[a] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[a], a))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// replaySelection reads what a replay form selects: the letters of the
// message IDs checked (scope "selected"), or those the filter selects
// (scope "filtered").
func (c *Console) replaySelection(r *http.Request) (letterFilter, []string, error) {
	lf, err := parseFilter(r.PostForm)
	if err != nil {
		return lf, nil, err
	}
	var ids []string
	switch r.PostFormValue("scope") {
	case "selected":
		if ids = formIDs(r); len(ids) == 0 {
			return lf, nil, badf("no letter selected: check the letters to replay, or replay every filtered letter")
		}
	case "filtered":
		return lf, nil, nil
	default:
		return lf, nil, badf("scope: want selected or filtered, not %q", r.PostFormValue("scope"))
	}
	if len(ids) > ReplaySelectionMax {
		return lf, nil, badf("%d messages selected: at most %d per replay; narrow the filter", len(ids), ReplaySelectionMax)
	}
	return lf, ids, nil
}

// formIDs are the message IDs a replay form checks: trimmed, each once, in
// order.
func formIDs(r *http.Request) []string {
	var ids []string
	seen := map[string]bool{}
	for _, id := range r.PostForm["id"] {
		if id = strings.TrimSpace(id); id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// selectionAction is the form action of a replay's confirm form: it names
// the topic and the selection (scope, filter and message IDs), so that its
// token, which only the dry run of that selection issues, confirms that
// replay and no other.
func selectionAction(topic, scope string, lf letterFilter, ids []string) string {
	h := sha256.New()
	for _, s := range append([]string{topic, scope, lf.Values().Encode()}, ids...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return "dlq.replay " + hex.EncodeToString(h.Sum(nil))
}

// replayAction is the action a replay form's token must name: that of
// the selection it posts.
func (c *Console) replayAction(r *http.Request) string {
	lf, err := parseFilter(r.PostForm)
	if err != nil {
		return ""
	}
	return selectionAction(r.PathValue("topic"), r.PostFormValue("scope"), lf, formIDs(r))
}

// runReplay runs the Reprocessor over the selection: the filter, or the
// message IDs with the filter's other fields.
func (c *Console) runReplay(ctx context.Context, topic, by string, lf letterFilter, ids []string, dryRun bool) (*replayData, error) {
	d := &replayData{Topic: topic, Mode: "republish", DryRun: dryRun, Filter: lf, IDs: ids, Items: []replayItem{},
		Records: dlq.Counts{}, Messages: dlq.Counts{}}
	handler := c.cfg.Redrive[topic]
	mode := dlq.Republish
	if handler != nil {
		mode, d.Mode = dlq.Redrive, "redrive"
	}
	f := lf.f
	if ids != nil {
		f.MessageIDs = ids
	}
	rp, err := dlq.NewReprocessor(c.pool, &dlq.ReprocessorConfig{Kafka: c.cfg.Kafka, Topic: topic, Mode: mode,
		Handler: handler, Tables: c.tables, Filter: f, DryRun: dryRun, ReplayedBy: by, MaxOutage: time.Minute,
		Logger: c.log, Progress: func(it dlq.Item) {
			if it.Action == dlq.Skipped {
				return
			}
			ri := replayItem{Action: it.Action, Partition: it.Raw.Partition, Offset: it.Raw.Offset}
			if x := it.DeadLetter; x != nil {
				ri.MessageID = x.MessageID
				ri.Origin = fmt.Sprintf("%s/%d/%d", x.Origin.Topic, x.Origin.Partition, x.Origin.Offset)
			}
			if it.Err != nil {
				ri.Error = c.red.Text(it.Err.Error())
			}
			d.Items = append(d.Items, ri)
		}})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer rp.Close()
	sum, err := rp.Run(ctx)
	for a, n := range sum.Records {
		if a != dlq.Skipped {
			d.Records[a] += n
		}
	}
	for a, n := range sum.Messages {
		if a != dlq.Skipped {
			d.Messages[a] += n
		}
	}
	if err != nil {
		return d, fmt.Errorf("replay: %w", err)
	}
	return d, nil
}

func (c *Console) replayDryRun(w http.ResponseWriter, r *http.Request, rq *request, _ string) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	topic, err := c.topicOf(r)
	if err != nil {
		c.failErr(w, r, rq, "dry run", err)
		return
	}
	lf, ids, err := c.replaySelection(r)
	if err != nil {
		c.failErr(w, r, rq, "dry run", err)
		return
	}
	d, err := c.runReplay(ctx, topic, rq.principal.Name, lf, ids, true)
	if err != nil {
		c.failErr(w, r, rq, "dry run", err)
		return
	}
	if !c.cfg.ReadOnly && len(d.Items) > 0 {
		scope := "filtered"
		if ids != nil {
			scope = "selected"
		}
		d.ConfirmToken = c.forms.issue(rq.principal.Name, selectionAction(topic, scope, lf, ids))
	}
	c.render(w, rq, http.StatusOK, "replay", "Replay "+topic+": dry run", d)
}

// replay runs the replay a dry run showed, once per form.
func (c *Console) replay(w http.ResponseWriter, r *http.Request, rq *request, key string) {
	topic, err := c.topicOf(r)
	if err != nil {
		c.failErr(w, r, rq, "replay", err)
		return
	}
	lf, ids, err := c.replaySelection(r)
	if err != nil {
		c.failErr(w, r, rq, "replay", err)
		return
	}
	target := topic + ": " + lf.String()
	if ids != nil {
		target = topic + ": message IDs " + strings.Join(ids, ",")
	}
	var d *replayData
	running := false // another replay of the topic holds its lock
	res, err := c.act(r, rq, key, "dlq.replay", target, func(ctx context.Context) (string, error) {
		var err error
		d, err = c.runReplay(ctx, topic, rq.principal.Name+" (console)", lf, ids, false)
		if errors.Is(err, dlq.ErrReplayRunning) {
			running = true
			return "", errors.New("refused: a replay of this dead-letter topic is running: try again once it has ended (see the audit page)")
		}
		if d == nil {
			return "", err
		}
		return "records: " + countsText(d.Records) + "; origin messages: " + countsText(d.Messages), err
	})
	if err != nil {
		c.failErr(w, r, rq, "audit the replay", err)
		return
	}
	if d == nil {
		d = &replayData{Topic: topic, Filter: lf, IDs: ids, Items: []replayItem{}, Records: dlq.Counts{}, Messages: dlq.Counts{}}
	}
	d.Result = &res
	status := http.StatusOK
	switch {
	case res.Duplicate:
	case running:
		status, d.Error = http.StatusConflict, res.Detail
	case res.Outcome == outcomeFailed:
		status, d.Error = http.StatusInternalServerError, res.Detail
	}
	c.render(w, rq, status, "replay", "Replay "+topic, d)
}
