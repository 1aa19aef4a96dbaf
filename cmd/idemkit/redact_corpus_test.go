package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// redactionCase is a dead letter whose secrets no output of the CLI may
// show by default.
type redactionCase struct {
	name    string
	value   string
	headers []kafka.Header
	err     string
	secrets []string // none may appear; digits also not with separators removed
}

var redactionCorpus = []redactionCase{
	{name: "truncated JSON", value: `{"amount":1,"password":"trunc-pw-1`, secrets: []string{"trunc-pw-1"}},
	{name: "NDJSON", value: "{\"a\":1}\n{\"token\":\"ndjson-tok-2\"}\n", secrets: []string{"ndjson-tok-2"}},
	{name: "BOM JSON", value: "\ufeff{\"secret\":\"bom-secret-3\"}", secrets: []string{"bom-secret-3"}},
	{name: "JSON in a string", value: `{"payload":"{\"password\":\"nested-pw-4\"}"}`, secrets: []string{"nested-pw-4"}},
	{name: "near-miss names", value: `{"newPassword":"np-5a","client_secret":"cs-5b","id_token":"it-5c",` +
		`"private_key":"pk-5d","aws_access_key_id":"ak-5e","stripe_key":"sk-5f"}`,
		secrets: []string{"np-5a", "cs-5b", "it-5c", "pk-5d", "ak-5e", "sk-5f"}},
	{name: "form body", value: "amount=10&password=form-pw-6&client_secret=form-cs-6&note=ok",
		secrets: []string{"form-pw-6", "form-cs-6"}},
	{name: "card with %20", value: "pay 4111%201111%201111%201111 now", secrets: []string{"411111111111"}},
	{name: "card with slashes", value: `{"note":"4111/1111/1111/1111"}`, secrets: []string{"411111111111"}},
	{name: "card in a longer run", value: "ref 9900411111111111111100", secrets: []string{"411111111111"}},
	{name: "JWT", value: `{"note":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJqd3QtNyJ9.c2lnLTc"}`,
		secrets: []string{"eyJzdWIiOiJqd3QtNyJ9", "c2lnLTc"}},
	{name: "XML", value: `<req><amount>1</amount><password>xml-pw-8</password></req>`, secrets: []string{"xml-pw-8"}},
	{name: "headers", value: `{}`, headers: []kafka.Header{
		{Key: "X-Api-Key", Value: []byte("hdr-9a")}, {Key: "X-Auth-Token", Value: []byte("hdr-9b")},
		{Key: "Proxy-Authorization", Value: []byte("Basic aGRyLTljOng=")}},
		secrets: []string{"hdr-9a", "hdr-9b", "aGRyLTljOng"}},
	{name: "error texts", value: `{}`, err: "upstream: api_key=sk_live_err10abcDEF and password=err-pw-10, " +
		"Authorization: Bearer err-bearer-10, token eyJhbGciOiJIUzI1NiJ9.eyJlcnIiOjEwfQ.ZXJyMTA",
		secrets: []string{"sk_live_err10abcDEF", "err-pw-10", "err-bearer-10", "eyJlcnIiOjEwfQ", "ZXJyMTA"}},
}

// TestRedactionCorpus: dead letters holding secrets in the shapes a
// redaction misses most easily (not JSON, near-miss names, nested JSON,
// separators, tokens in error texts, headers) show none of them through
// the built binary: dlq inspect and dlq list, as text and with -json.
func TestRedactionCorpus(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	env := []string{"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, c := range redactionCorpus {
		cause := c.err
		if cause == "" {
			cause = "declined"
		}
		m := &consumer.Message{ID: "corpus", Message: kafka.Message{Topic: origin, Offset: int64(i), Key: []byte("k"),
			Value: []byte(c.value), Headers: c.headers}}
		merr := &consumer.MessageError{Topic: origin, Offset: int64(i), ID: "corpus", Attempts: 1,
			Class: retry.ClassPermanent, FirstFailure: now, LastFailure: now, Err: errors.New(cause)}
		if err := w.OnFailure(context.Background(), m, merr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{}
	for _, args := range [][]string{
		{"dlq", "inspect", "-topic", dead, "-id", "corpus"},
		{"dlq", "inspect", "-topic", dead, "-id", "corpus", "-json"},
		{"dlq", "list", "-topic", dead},
		{"dlq", "list", "-topic", dead, "-json"},
	} {
		out, errOut, code := cli(t, bin, env, args...)
		if code != 0 {
			t.Fatalf("%v: code %d\n%s%s", args, code, out, errOut)
		}
		outputs[strings.Join(args[3:], " ")] = out + errOut
	}
	if n := strings.Count(outputs[dead+" -id corpus"], "dead letter "+dead); n != len(redactionCorpus) {
		t.Fatalf("inspect showed %d dead letters, want %d:\n%s", n, len(redactionCorpus), outputs[dead+" -id corpus"])
	}
	unsep := strings.NewReplacer("%20", "", " ", "", "-", "", ".", "", "/", "", "_", "")
	for _, c := range redactionCorpus {
		t.Run(c.name, func(t *testing.T) {
			for what, out := range outputs {
				for _, s := range c.secrets {
					if strings.Contains(out, s) || strings.Contains(unsep.Replace(out), unsep.Replace(s)) {
						t.Errorf("%q shows %q:\n%s", what, s, out)
					}
				}
			}
		})
	}
}

// TestTerminalEscapes: message IDs, values, header names and error texts
// that carry terminal control sequences (ESC[8m hides text, OSC 0 sets the
// window title, OSC 52 writes the clipboard, C1 CSI) reach the terminal
// escaped, in every output, with -show-payload too.
func TestTerminalEscapes(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	env := []string{"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	id := "pay-1\x1b[8mhidden"
	m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Key: []byte("k\x1b]0;title\x07"),
		Value:   []byte("plain \x1b]52;c;ZXZpbA==\x07 and \u009b31m red"),
		Headers: []kafka.Header{{Key: "X-\x1b[8mHidden", Value: []byte("v\x1b[2J")}}}}
	merr := &consumer.MessageError{Topic: origin, ID: id, Attempts: 1, Class: retry.ClassPermanent,
		FirstFailure: time.Now(), LastFailure: time.Now(), Err: errors.New("boom \x1b]0;pwned\x07 \u009b2J")}
	if err := w.OnFailure(context.Background(), m, merr); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"dlq", "inspect", "-topic", dead, "-at", "0/0"},
		{"dlq", "inspect", "-topic", dead, "-at", "0/0", "-show-payload"},
		{"dlq", "inspect", "-topic", dead, "-at", "0/0", "-json"},
		{"dlq", "list", "-topic", dead},
		{"dlq", "list", "-topic", dead, "-show-payload"},
		{"dlq", "list", "-topic", dead, "-json"},
	} {
		out, errOut, code := cli(t, bin, env, args...)
		if code != 0 {
			t.Fatalf("%v: code %d\n%q%q", args, code, out, errOut)
		}
		for _, bad := range []string{"\x1b", "\x07", "\u009b", "\x9b"} {
			if strings.Contains(out+errOut, bad) {
				t.Errorf("%v writes %q raw:\n%q", args, bad, out+errOut)
			}
		}
		if !strings.Contains(out, "pay-1") {
			t.Errorf("%v does not show the message ID:\n%q", args, out)
		}
	}
}
