package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the unit of utime and stime in /proc/<pid>/stat (USER_HZ).
// Linux fixes it at 100 on every architecture Go supports.
const clockTicks = 100

// maxProcFile bounds what is read from one /proc file.
const maxProcFile = 64 << 10

// procSample is one reading of a process's CPU time and memory.
type procSample struct {
	// At is when the sample was taken.
	At time.Time
	// CPU is user plus system time the process has used since it started.
	CPU time.Duration
	// RSS is the resident set size now (VmRSS); HWM is its peak so far
	// (VmHWM). Both in bytes.
	RSS, HWM int64
	// Threads is the number of threads (Threads in status).
	Threads int
}

// readProc reads /proc/<pid>/stat and /proc/<pid>/status.
func readProc(pid int) (procSample, error) {
	if pid <= 0 {
		return procSample{}, fmt.Errorf("read process %d: invalid pid", pid)
	}
	at := time.Now()
	stat, err := readBounded(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	cpu, err := parseStatCPU(stat)
	if err != nil {
		return procSample{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	status, err := readBounded(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procSample{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	s, err := parseStatus(status)
	if err != nil {
		return procSample{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	s.At, s.CPU = at, cpu
	return s, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxProcFile))
}

// parseStatCPU returns utime+stime from the contents of /proc/<pid>/stat.
// The command name (field 2) is in parentheses and may itself contain
// spaces and parentheses, so fields are counted after its last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	// After ") " come fields 3 (state) onwards; utime is field 14, stime 15.
	fields := strings.Fields(string(stat[i+1:]))
	const utimeIdx, stimeIdx = 14 - 3, 15 - 3
	if len(fields) <= stimeIdx {
		return 0, fmt.Errorf("stat: %d fields after the command name, want at least %d", len(fields), stimeIdx+1)
	}
	ut, err := strconv.ParseUint(fields[utimeIdx], 10, 63)
	if err != nil {
		return 0, fmt.Errorf("stat: utime %q: %w", fields[utimeIdx], err)
	}
	st, err := strconv.ParseUint(fields[stimeIdx], 10, 63)
	if err != nil {
		return 0, fmt.Errorf("stat: stime %q: %w", fields[stimeIdx], err)
	}
	ticks := ut + st
	if ticks > uint64(1<<62)/uint64(time.Second/clockTicks) {
		return 0, fmt.Errorf("stat: cpu time %d ticks out of range", ticks)
	}
	return time.Duration(ticks) * (time.Second / clockTicks), nil
}

// parseStatus reads VmRSS, VmHWM and Threads from the contents of
// /proc/<pid>/status. VmRSS and VmHWM are required.
func parseStatus(status []byte) (procSample, error) {
	var s procSample
	var haveRSS, haveHWM bool
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "VmRSS", "VmHWM":
			n, err := parseKB(val)
			if err != nil {
				return procSample{}, fmt.Errorf("status: %s: %w", key, err)
			}
			if key == "VmRSS" {
				s.RSS, haveRSS = n, true
			} else {
				s.HWM, haveHWM = n, true
			}
		case "Threads":
			n, err := strconv.Atoi(val)
			if err != nil {
				return procSample{}, fmt.Errorf("status: Threads %q: %w", val, err)
			}
			s.Threads = n
		}
	}
	if err := sc.Err(); err != nil {
		return procSample{}, fmt.Errorf("status: %w", err)
	}
	if !haveRSS || !haveHWM {
		return procSample{}, errors.New("status: VmRSS or VmHWM missing (process exited or is a kernel thread?)")
	}
	return s, nil
}

// parseKB parses "1234 kB" into bytes.
func parseKB(v string) (int64, error) {
	num, unit, _ := strings.Cut(v, " ")
	if strings.TrimSpace(unit) != "kB" {
		return 0, fmt.Errorf("unit of %q is not kB", v)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		return 0, fmt.Errorf("size %q: not a kB count", v)
	}
	return n * 1024, nil
}
