package bench

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A /proc/<pid>/stat line whose command name holds spaces and parentheses.
const statLine = "4242 (beam (x) y) S 1 4242 4242 0 -1 4194560 2817 0 0 0 1234 567 0 0 20 0 9 0 123456 1500000000 5000 18446744073709551615 1 1 0 0 0 0 0 0 2143420159 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"

const statusText = `Name:	beam
Umask:	0022
State:	S (sleeping)
Tgid:	4242
VmPeak:	 1700000 kB
VmHWM:	  123456 kB
VmRSS:	  100000 kB
Threads:	9
voluntary_ctxt_switches:	150
`

func TestParseStatCPU(t *testing.T) {
	t.Parallel()
	cpu, err := parseStatCPU([]byte(statLine))
	require.NoError(t, err)
	require.Equal(t, (1234+567)*10*time.Millisecond, cpu)

	for _, bad := range []string{
		"",
		"4242 beam S 1",
		"4242 (beam) S 1 2 3",
		"4242 (beam) S 1 4242 4242 0 -1 4194560 2817 0 0 0 x 567 0",
		"4242 (beam) S 1 4242 4242 0 -1 4194560 2817 0 0 0 12 -5 0",
		"4242 (beam) S 1 4242 4242 0 -1 4194560 2817 0 0 0 9223372036854775807 1 0",
	} {
		_, err := parseStatCPU([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	s, err := parseStatus([]byte(statusText))
	require.NoError(t, err)
	require.EqualValues(t, 100000*1024, s.RSS)
	require.EqualValues(t, 123456*1024, s.HWM)
	require.Equal(t, 9, s.Threads)

	_, err = parseStatus([]byte("Name:\tkthreadd\nThreads:\t1\n"))
	require.Error(t, err)
	_, err = parseStatus([]byte("VmRSS:\t12 MB\nVmHWM:\t1 kB\n"))
	require.Error(t, err)
	_, err = parseStatus([]byte("VmRSS:\tlots kB\nVmHWM:\t1 kB\n"))
	require.Error(t, err)
	_, err = parseStatus([]byte("VmRSS:\t1 kB\nVmHWM:\t1 kB\nThreads:\tmany\n"))
	require.Error(t, err)
}

func TestReadProcSelf(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	s, err := readProc(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, s.RSS)
	require.GreaterOrEqual(t, s.HWM, s.RSS)
	require.Positive(t, s.Threads)
	require.False(t, s.At.IsZero())

	_, err = readProc(0)
	require.Error(t, err)
	_, err = readProc(1 << 30)
	require.Error(t, err)
}

func FuzzParseProc(f *testing.F) {
	f.Add([]byte(statLine))
	f.Add([]byte(statusText))
	f.Add([]byte("1 ()) ) R"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if cpu, err := parseStatCPU(b); err == nil {
			require.GreaterOrEqual(t, cpu, time.Duration(0))
		}
		if s, err := parseStatus(b); err == nil {
			require.GreaterOrEqual(t, s.RSS, int64(0))
			require.GreaterOrEqual(t, s.HWM, int64(0))
		}
	})
}
