package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Before every agent start the benchmark waits for the machine to settle: right after seeding
// thousands of Services (and after a previous run's agent) the API server and etcd keep working for
// seconds, and a cold start timed then competes with them for the CPUs while its floor is measured
// later on a quiet machine. A start waits until one second passes with at least quietIdle of the
// CPUs idle, or quietMax at most (then it goes on and says so).
const (
	quietWindow = time.Second
	quietIdle   = 0.90
	quietMax    = 30 * time.Second
)

// cpuIdle reads the machine's total and idle (idle + iowait) jiffies from /proc/stat. The total is
// the first eight fields (user … steal): guest and guest_nice are already counted in user and nice.
func cpuIdle() (total, idle uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	fields := f[1:]
	if len(fields) > 8 {
		fields = fields[:8]
	}
	for i, s := range fields {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: field %d: %w", i+1, err)
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return total, idle, nil
}

// waitQuiet waits for a quiet window and returns the idle share of the last window and how long it
// waited.
func waitQuiet(ctx context.Context) (share float64, waited time.Duration, err error) {
	start := time.Now()
	t0, i0, err := cpuIdle()
	if err != nil {
		return 0, 0, err
	}
	for {
		select {
		case <-ctx.Done():
			return 0, time.Since(start), ctx.Err()
		case <-time.After(quietWindow):
		}
		t1, i1, err := cpuIdle()
		if err != nil {
			return 0, time.Since(start), err
		}
		if t1 > t0 {
			share = float64(i1-i0) / float64(t1-t0)
		}
		if share >= quietIdle || time.Since(start) >= quietMax {
			return share, time.Since(start), nil
		}
		t0, i0 = t1, i1
	}
}
