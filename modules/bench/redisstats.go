package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"
)

// redisStats is what INFO commandstats and INFO cpu say, summed over the
// nodes: calls and µs per command, and the server's CPU seconds.
type redisStats struct {
	calls, usec map[string]float64
	cpu         float64
}

func readRedisStats(ctx context.Context, rdb rueidis.Client) (redisStats, error) {
	st := redisStats{calls: map[string]float64{}, usec: map[string]float64{}}
	for addr, node := range rdb.Nodes() {
		info, err := node.Do(ctx, node.B().Info().Section("commandstats", "cpu").Build()).ToString()
		if err != nil {
			return st, fmt.Errorf("bench: INFO on %s: %w", addr, err)
		}
		sc := bufio.NewScanner(strings.NewReader(info))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if name, rest, ok := strings.Cut(line, ":"); ok {
				switch {
				case strings.HasPrefix(name, "cmdstat_"):
					cmd := strings.TrimPrefix(name, "cmdstat_")
					for _, kv := range strings.Split(rest, ",") {
						k, v, _ := strings.Cut(kv, "=")
						n, _ := strconv.ParseFloat(v, 64)
						switch k {
						case "calls":
							st.calls[cmd] += n
						case "usec":
							st.usec[cmd] += n
						}
					}
				case name == "used_cpu_sys" || name == "used_cpu_user":
					n, _ := strconv.ParseFloat(rest, 64)
					st.cpu += n
				}
			}
		}
	}
	return st, nil
}

// perSend is the Redis time per send between before and s: the command µs
// of the side's top-level commands (each weighted by how often one send
// issues it, at the average µs per call of the interval — a script's µs
// include the commands it runs; a command weighted asObserved counts with
// all its µs of the interval, divided by the sends), and the whole server's
// CPU µs divided by the sends (other clients of a shared server included).
// asObserved weighs a command a send issues a varying number of times (the
// HTTP send's post-ack call is shared by the sends acknowledged together):
// its whole time in the interval counts, other clients' calls of it on a
// shared server included.
const asObserved = -1

func (s redisStats) perSend(before redisStats, weights map[string]float64, sends int64) (commandUS, cpuUS float64) {
	if sends <= 0 {
		return 0, 0
	}
	for cmd, w := range weights {
		calls := s.calls[cmd] - before.calls[cmd]
		switch {
		case calls <= 0:
		case w == asObserved:
			commandUS += (s.usec[cmd] - before.usec[cmd]) / float64(sends)
		default:
			commandUS += w * (s.usec[cmd] - before.usec[cmd]) / calls
		}
	}
	return commandUS, (s.cpu - before.cpu) * 1e6 / float64(sends)
}

// recordBytes is the mean MEMORY USAGE of the keys that still exist.
func (b *sendBench) recordBytes(ctx context.Context, keys []string) (float64, error) {
	rdb := b.p.Redis
	var sum, n float64
	for _, k := range keys {
		v, err := rdb.Do(ctx, rdb.B().MemoryUsage().Key(k).Samples(0).Build()).AsInt64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return 0, err
		}
		sum, n = sum+float64(v), n+1
	}
	if n == 0 {
		return 0, fmt.Errorf("bench: no idempotency record left to weigh")
	}
	return sum / n, nil
}

// resetPeakRSS starts a new peak-RSS window for this process (Linux: the
// peak in /proc/self/status is reset by writing 5 to clear_refs); elsewhere
// it does nothing and peakRSS reports 0.
func resetPeakRSS() {
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// peakRSS is this process's peak resident set since the last reset, in
// bytes (0 where /proc does not tell).
func peakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// processCPU is the CPU time this process used so far, user and system (0
// where getrusage does not tell): per send it weighs a side's own work
// apart from what the rest of a shared machine does to its rate.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
