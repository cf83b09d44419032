package wire

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseTimestamp(t *testing.T) {
	t.Parallel()
	// Expected values are what Node's Date.parse returns (milliseconds since the epoch).
	cases := map[string]int64{
		"2026-03-30T15:00:00.000Z":            1774882800000,
		"2026-03-30T15:00:00Z":                1774882800000,
		"2026-03-30T15:00:00.123456Z":         1774882800123,
		"2026-03-30T15:00:00.123456789+02:00": 1774875600123,
		"2026-03-30T15:00:00.1Z":              1774882800100,
		"2026-03-30T15:00:00.9999Z":           1774882800999,
		"2026-03-30T15:00Z":                   1774882800000,
		"2026-03-30":                          1774828800000,
		"2026-03-30t15:00:00z":                1774882800000,
		"2026-03-30 15:00:00Z":                1774882800000,
		"2026-03-30T15:00:00+0200":            1774875600000,
		"2026-03-30T15:00:00-05:30":           1774902600000,
		"2026-02-30T00:00:00Z":                1772409600000, // rolls over like Date
		"2026-03-30T24:00:00Z":                1774915200000,
	}
	for in, want := range cases {
		got, err := ParseTimestamp(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got.UnixMilli(), in)
	}
	for _, bad := range []string{
		"", "2026", "2026-13-01T00:00:00Z", "2026-03-32T00:00:00Z", "2026-03-30T25:00:00Z",
		"2026-03-30T24:00:01Z", "2026-03-30T15:00:60Z", "2026-03-30T15:00:00", "2026-03-30T15:00:00.Z",
		"2026-03-30T15:00:00Zx", "March 30 2026", "2026-03-30T15:00:00+24:00", "__NOW__",
	} {
		_, err := ParseTimestamp(bad)
		require.Error(t, err, bad)
	}
}

func TestFormatTimestamp(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 30, 17, 4, 5, 6_789_000, time.FixedZone("x", 2*3600))
	require.Equal(t, "2026-03-30T15:04:05.006Z", FormatTimestamp(at))
	back, err := ParseTimestamp(FormatTimestamp(at))
	require.NoError(t, err)
	require.Equal(t, at.Truncate(time.Millisecond).UnixMilli(), back.UnixMilli())
}
