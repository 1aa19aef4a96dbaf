// Package promtest runs a real Prometheus server (the prometheus binary of
// Debian's package, installed by scripts/dev prometheus) for tests: it
// scrapes the targets it is given every second, evaluates the rule files it
// is given every second, and answers queries through its HTTP API.
package promtest

import (
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
)

// Server is a running Prometheus server.
type Server struct {
	// URL is its address, http://127.0.0.1:port.
	URL string
}

// Start starts a Prometheus server of the test's own on a free loopback
// port, scraping targets (host:port, path /metrics) every second and
// evaluating the rules of ruleFiles every second; it stops with the test.
// The test fails when prometheus is not installed.
func Start(t testing.TB, targets []string, ruleFiles ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed: run scripts/dev prometheus (Debian's package), as scripts/test does")
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, target := range targets {
		quoted[i] = strconv.Quote(target)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: idemkit
    static_configs:
      - targets: [%s]
`, strings.Join(quoted, ", "))
	if len(ruleFiles) > 0 {
		config += "rule_files:\n"
		for _, f := range ruleFiles {
			config += fmt.Sprintf("  - %q\n", f)
		}
	}
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
	s := &Server{URL: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus at %s not ready after 30s: %v\n%s", addr, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// get decodes the data of an API answer into data.
func (s *Server) get(path string, data any) error {
	resp, err := http.Get(s.URL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("prometheus %s: %s", path, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

// Instant runs an instant query whose result is one sample; false when it
// has none (or several).
func (s *Server) Instant(query string) (float64, bool, error) {
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := s.get("/api/v1/query?query="+url.QueryEscape(query), &data); err != nil {
		return 0, false, err
	}
	if len(data.Result) != 1 {
		return 0, false, nil
	}
	v, _ := data.Result[0].Value[1].(string)
	f, err := strconv.ParseFloat(v, 64)
	return f, err == nil, err
}

// WaitForValue polls until query returns want, for at most a minute.
func (s *Server) WaitForValue(t testing.TB, query string, want float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		got, ok, err := s.Instant(query)
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

// Alert is an alert as the server's API lists it.
type Alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // pending or firing
	Value       string            `json:"value"`
}

// Alerts returns the pending and firing alerts.
func (s *Server) Alerts() ([]Alert, error) {
	var data struct {
		Alerts []Alert `json:"alerts"`
	}
	if err := s.get("/api/v1/alerts", &data); err != nil {
		return nil, err
	}
	return data.Alerts, nil
}

// Sample is one series of an instant query's result.
type Sample struct {
	Metric map[string]string
	Value  string
}

// Query runs an instant query and returns every series of its result.
func (s *Server) Query(query string) ([]Sample, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := s.get("/api/v1/query?query="+url.QueryEscape(query), &data); err != nil {
		return nil, err
	}
	out := make([]Sample, len(data.Result))
	for i, r := range data.Result {
		v, _ := r.Value[1].(string)
		out[i] = Sample{Metric: r.Metric, Value: v}
	}
	return out, nil
}
