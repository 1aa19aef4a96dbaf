package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cpuUsage matches the bench's cpuUsage: CPU seconds of the measured
// interval spent by this process, its PostgreSQL backends, the Kafka broker
// and the whole machine.
type cpuUsage struct {
	Self        float64 `json:"self_s"`
	Postgres    float64 `json:"postgres_backends_s"`
	PostgresOK  bool    `json:"postgres_ok"`
	Kafka       float64 `json:"kafka_broker_s"`
	KafkaOK     bool    `json:"kafka_ok"`
	MachineBusy float64 `json:"machine_busy_s"`
	MachineOK   bool    `json:"machine_ok"`
}

// clockTick is USER_HZ, the unit of /proc CPU times.
const clockTick = 10 * time.Millisecond

type cpuSnapshot struct {
	self, postgres, kafka, machine time.Duration
	postgresOK, kafkaOK, machineOK bool
}

type cpuMeter struct {
	backends []int
	kafkaPID int

	mu    sync.Mutex
	start cpuSnapshot
	usage cpuUsage
}

func (m *cpuMeter) snapshot() cpuSnapshot {
	var s cpuSnapshot
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.postgresOK = len(m.backends) > 0
	for _, pid := range m.backends {
		d, ok := processCPU(pid)
		s.postgres += d
		s.postgresOK = s.postgresOK && ok
	}
	if m.kafkaPID > 0 {
		s.kafka, s.kafkaOK = processCPU(m.kafkaPID)
	}
	s.machine, s.machineOK = machineBusy()
	return s
}

func (m *cpuMeter) begin() {
	s := m.snapshot()
	m.mu.Lock()
	m.start = s
	m.mu.Unlock()
}

func (m *cpuMeter) end() {
	s := m.snapshot()
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.start
	m.usage = cpuUsage{
		Self:        (s.self - b.self).Seconds(),
		Postgres:    (s.postgres - b.postgres).Seconds(),
		PostgresOK:  s.postgresOK && b.postgresOK,
		Kafka:       (s.kafka - b.kafka).Seconds(),
		KafkaOK:     s.kafkaOK && b.kafkaOK,
		MachineBusy: (s.machine - b.machine).Seconds(),
		MachineOK:   s.machineOK && b.machineOK,
	}
}

func (m *cpuMeter) result() cpuUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usage
}

// processCPU reads utime+stime of a process from /proc/PID/stat.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold spaces
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * clockTick, true
}

// machineBusy reads the CPU time all CPUs spent not idle from /proc/stat.
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest times are already in user
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		busy += n
	}
	return time.Duration(busy) * clockTick, true
}
