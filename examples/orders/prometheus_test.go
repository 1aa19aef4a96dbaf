package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
)

// TestPrometheusScrapesTheDemo runs the demo with its telemetry while a real
// Prometheus server (Debian's package, installed by scripts/dev prometheus)
// scrapes its /metrics, then asks Prometheus's HTTP API for the counters:
// they must equal what the demo saw happen (10 applied, 2 duplicates).
func TestPrometheusScrapesTheDemo(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed: run scripts/dev prometheus (Debian's package), as scripts/test does")
	}
	obs, err := startTelemetry("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.shutdown(context.Background()) })
	prom := startPrometheus(t, bin, obs.addr)

	db := testenv.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := scenario(ctx, testenv.DatabaseURL(t), testenv.Brokers(t), db.Schema, t.Output(), obs)
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}
	want := map[consumer.Outcome]int{}
	for _, outs := range res.Outcomes {
		for _, o := range outs {
			want[o]++
		}
	}
	if want[consumer.Applied] != len(orders) || want[consumer.Duplicate] != 2 {
		t.Fatalf("the demo saw %v, want %d applied and 2 duplicates", want, len(orders))
	}
	for _, o := range []consumer.Outcome{consumer.Applied, consumer.Duplicate} {
		q := fmt.Sprintf(`sum(idemkit_consumer_messages_total{topic=%q,outcome=%q})`, res.Topic, o)
		waitForValue(t, prom, q, float64(want[o]))
	}
	// Both consumers (two groups, one Name) joined a group once each.
	waitForValue(t, prom, `sum(idemkit_consumer_rebalances_total{consumer="order-service"}) >= bool 2`, 1)
}

// startPrometheus starts a Prometheus server of the test's own on a free
// loopback port, scraping target every second; it stops with the test.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: orders-demo
    static_configs:
      - targets: [%q]
`, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return "http://" + addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus at %s not ready after 30s: %v\n%s", addr, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitForValue polls Prometheus until query returns want.
func waitForValue(t *testing.T, prom, query string, want float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		got, ok, err := instant(prom, query)
		switch {
		case err != nil:
			last = err.Error()
		case ok && got == want:
			return
		case ok:
			last = strconv.FormatFloat(got, 'f', -1, 64)
		default:
			last = "no result yet"
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("prometheus: %s = %s, want %v", query, last, want)
}

// instant runs an instant query whose result is one sample.
func instant(prom, query string) (float64, bool, error) {
	resp, err := http.Get(prom + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, false, err
	}
	if body.Status != "success" {
		return 0, false, fmt.Errorf("query %s: %s", query, body.Error)
	}
	if len(body.Data.Result) != 1 {
		return 0, false, nil
	}
	s, _ := body.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil, err
}
