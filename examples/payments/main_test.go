package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// The scenario against the test server: two lost responses, three attempts,
// one charge and one PaymentCreated event.
// With -store redis too: the records in Redis.
func TestScenario(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { testScenario(t, "") })
	t.Run("redis", func(t *testing.T) {
		u := os.Getenv("IDEMKIT_TEST_REDIS_URL")
		if u == "" {
			t.Fatal("IDEMKIT_TEST_REDIS_URL is not set: run scripts/test, or scripts/dev redis and source .dev/redis.env")
		}
		testScenario(t, u)
	})
}

func testScenario(t *testing.T, redisURL string) {
	db := testenv.NewDB(t) // an empty schema, dropped at cleanup; run migrates it
	var out bytes.Buffer
	if err := run(context.Background(), testenv.DatabaseURL(t), db.Schema, redisURL, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if redisURL != "" && !strings.Contains(out.String(), "records: Redis") {
		t.Fatalf("the records were not in Redis:\n%s", out.String())
	}
	for _, want := range []string{
		"network: the server answered 201, the answer was lost",
		"client: attempt 3 answered",
		`Idempotent-Replayed: "true"`,
		"charges for order-842: 1, PaymentCreated events in the outbox: 1",
		// The attempts whose answers were lost were replays, counted as such.
		`outcome="first"`,
		`outcome="replay"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		switch {
		case strings.Contains(line, `outcome="first"`) && !strings.HasSuffix(line, " 1"),
			strings.Contains(line, `outcome="replay"`) && !strings.HasSuffix(line, " 2"):
			t.Fatalf("want 1 first request and 2 replays counted: %s", line)
		}
	}
	if strings.Count(out.String(), "the answer was lost") != 2 {
		t.Fatalf("want two lost answers:\n%s", out.String())
	}
}
