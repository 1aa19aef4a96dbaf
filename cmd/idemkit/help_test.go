package main

import (
	"encoding/json"
	"net/url"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
)

// secretEnv is an environment whose database URL carries a password that
// must never be printed.
var secretEnv = []string{
	"IDEMKIT_DATABASE_URL=postgres://ops:hunter2secret@127.0.0.1:1/idemkit?connect_timeout=2",
	"IDEMKIT_KAFKA_BROKERS=127.0.0.1:1",
}

// flagLine is a flag in PrintDefaults' output; its description is on the
// next line.
var flagLine = regexp.MustCompile(`^  -([a-z0-9-]+)`)

// TestCLIHelpEverywhere: -h, --help, -help and a "help" argument exit 0
// at the top, for every group and for every command, with the usage on
// stdout and nothing on stderr; a command's help shows its synopsis, what it
// does and every flag with a description. Nothing needs a server, and the
// password of $IDEMKIT_DATABASE_URL never shows (it did, as -database's
// default).
func TestCLIHelpEverywhere(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}} {
		out, errOut, code := cli(t, bin, secretEnv, args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: idemkit COMMAND") {
			t.Errorf("%v: exit %d, stderr %q\n%s", args, code, errOut, out)
		}
		for _, c := range commands {
			if !strings.Contains(out, "idemkit "+c.name+" ") {
				t.Errorf("%v does not list %q", args, c.name)
			}
		}
	}
	for _, group := range []string{"migrate", "dlq", "idemhttp", "outbox", "dedup", "consumer", "consumer parked"} {
		for _, h := range []string{"-h", "--help", "help"} {
			args := append(strings.Fields(group), h)
			out, errOut, code := cli(t, bin, secretEnv, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "usage: idemkit "+group+" ") {
				t.Errorf("%v: exit %d, stderr %q\n%s", args, code, errOut, out)
			}
		}
		// A group alone is bad usage that shows its commands.
		_, errOut, code := cli(t, bin, secretEnv, strings.Fields(group)...)
		if code != 2 || !strings.Contains(errOut, "usage: idemkit "+group+" ") {
			t.Errorf("%s alone: exit %d, stderr %q", group, code, errOut)
		}
	}
	for _, c := range commands {
		words := strings.Fields(c.name)
		var first string
		for _, args := range [][]string{
			append(words, "-h"), append(words, "--help"), append(words, "help"),
			append([]string{"help"}, words...),
			append(append([]string{}, words...), "-json", "-h"), // after other flags too
		} {
			out, errOut, code := cli(t, bin, secretEnv, args...)
			if args[len(args)-2] == "-json" && code == 2 && strings.Contains(errOut, "not defined: -json") {
				continue // a command without -json
			}
			if code != 0 || errOut != "" {
				t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
				continue
			}
			if first == "" {
				first = out
			} else if out != first {
				t.Errorf("%q prints another help than %q -h:\n%s", args, c.name, out)
			}
		}
		if !strings.HasPrefix(first, "usage: idemkit "+c.name+" ") || !strings.Contains(first, "\nflags:\n") {
			t.Errorf("%s -h:\n%s", c.name, first)
		}
		if strings.Contains(first, "hunter2secret") {
			t.Errorf("%s -h shows the database password:\n%s", c.name, first)
		}
		_, flagPart, _ := strings.Cut(first, "\nflags:\n")
		lines := strings.Split(flagPart, "\n")
		flags := 0
		for i, l := range lines {
			m := flagLine.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			flags++
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "    \t") || len(strings.TrimSpace(lines[i+1])) < 5 {
				t.Errorf("%s -h: flag -%s has no description", c.name, m[1])
			}
		}
		if flags == 0 && c.name != "migrate up" {
			t.Errorf("%s -h shows no flags:\n%s", c.name, first)
		}
	}
	// Listings take -json.
	for _, name := range []string{"migrate status", "dlq list", "dlq inspect", "idemhttp stuck", "outbox stats", "outbox dead",
		"consumer positions", "consumer parked list", "consumer parked retry", "status", "version"} {
		out, _, _ := cli(t, bin, nil, append(strings.Fields(name), "-h")...)
		if !strings.Contains(out, "\n  -json\n") {
			t.Errorf("%s has no -json:\n%s", name, out)
		}
	}
	// Unknown commands and flags are bad usage, with the usage of what was meant.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, "usage: idemkit COMMAND"},
		{[]string{"dlq", "frobnicate"}, "usage: idemkit dlq list"},
		{[]string{"dlq", "list", "-nope"}, "usage: idemkit dlq list"},
		{[]string{"help", "frobnicate"}, "usage: idemkit COMMAND"},
	} {
		out, errOut, code := cli(t, bin, nil, tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, want 2 with %q on stderr\nstdout %q\nstderr %q", tc.args, code, tc.want, out, errOut)
		}
	}
}

// TestCLIVersion: idemkit version names the module, its version ("(devel)"
// from a checkout) and the Go version it was built with; -json says the
// same; --version is the same command.
func TestCLIVersion(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	out, errOut, code := cli(t, bin, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "idemkit ") || !strings.Contains(out, "github.com/idemkit/idemkit") ||
		!strings.Contains(out, runtime.Version()) {
		t.Fatalf("version: exit %d, stderr %q\n%s", code, errOut, out)
	}
	if again, _, code := cli(t, bin, nil, "--version"); code != 0 || again != out {
		t.Fatalf("--version: exit %d\n%s", code, again)
	}
	out, _, code = cli(t, bin, nil, "version", "-json")
	var v versionInfo
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Go != runtime.Version() || v.Version == "" ||
		v.Module != "github.com/idemkit/idemkit" {
		t.Fatalf("version -json: exit %d, %v\n%s", code, err, out)
	}
	if _, errOut, code := cli(t, bin, nil, "version", "extra"); code != 2 {
		t.Fatalf("version extra: exit %d, want 2 (%q)", code, errOut)
	}
}

// TestCLINoPasswordInErrors: whatever goes wrong with a database URL that
// carries a password (unreachable, unparsable, a bad option), the one line
// on stderr does not show the password.
func TestCLINoPasswordInErrors(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	for _, url := range []string{
		"postgres://ops:hunter2secret@127.0.0.1:1/idemkit?connect_timeout=2",
		"postgres://ops:hunter2secret@127.0.0.1:notaport/idemkit",
		"postgres://ops:hunter2secret@127.0.0.1:1/idemkit?sslmode=bogus",
		"host=127.0.0.1 port=1 user=ops password=hunter2secret connect_timeout=2",
		withPassword(t, testenv.DatabaseURL(t)), // the test server: refused, or let in and the schema is missing
	} {
		for _, args := range [][]string{
			{"migrate", "status", "-database", url},
			{"outbox", "stats", "-database", url, "-schema", "nowhere_at_all"},
			{"consumer", "parked", "list", "-topic", "t", "-name", "n", "-database", url, "-schema", "nowhere_at_all"},
		} {
			out, errOut, code := cli(t, bin, nil, args...)
			if code == 0 || strings.Contains(out+errOut, "hunter2secret") {
				t.Errorf("%q: exit %d, the password shows or nothing failed:\nstdout %q\nstderr %q", args, code, out, errOut)
			}
		}
	}
}

// withPassword returns the URL with the user ops and a password.
func withPassword(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("ops", "hunter2secret")
	return u.String()
}
