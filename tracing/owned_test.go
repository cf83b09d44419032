package tracing

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// The package's tests run with a projection registered for the jobs
// owner, as the job bus registers its own (bus/jobs is not linked here), so
// that every test of the writer exercises an owner's projection too.
var _ = Register(&Lifecycle{
	Name: "test job", Owner: OwnerJobs, Package: "tracing (tests)", States: []string{"x"},
	Transitions: []Transition{{To: "x"}},
	Projection:  &Projection{Table: "beam_test_jobs", New: func() ProjectedRow { return &countRow{} }},
})

// countRow folds a nonce's events into their count, states and last seq.
type countRow struct {
	Nonce  string  `json:"nonce"`
	Events int     `json:"events"`
	States []State `json:"states"`
	Last   int64   `json:"last"`
}

func (r *countRow) Apply(ev Event) {
	r.Nonce = ev.Nonce
	r.Events++
	r.States = append(r.States[:len(r.States):len(r.States)], ev.State)
	r.Last = ev.Seq
}

func (r *countRow) Clone() ProjectedRow            { c := *r; return &c }
func (r *countRow) MarshalBinary() ([]byte, error) { return json.Marshal(r) }
func (r *countRow) UnmarshalBinary(b []byte) error { return json.Unmarshal(b, r) }

func ownedRows(l *Log, ctx context.Context) (map[string]countRow, error) {
	out := map[string]countRow{}
	err := l.OwnedRows(ctx, OwnerJobs, func(nonce string, b []byte) error {
		var r countRow
		if err := r.UnmarshalBinary(b); err != nil {
			return err
		}
		out[nonce] = r
		return nil
	})
	return out, err
}

func ownedJobEvents(b *testBundle, n int) map[string]countRow {
	want := map[string]countRow{}
	for i := range n {
		nonce := fmt.Sprintf("job:owned-%d", i)
		first := received(nonce)
		first.Details.Owner = OwnerJobs
		evs := []Event{first, ev(nonce, Queued)}
		if i%2 == 0 {
			evs = append(evs, ev(nonce, Dispatched), ev(nonce, Delivered))
		}
		if i%4 == 0 {
			evs = append(evs, ev(nonce, Acked))
		}
		var r countRow
		for _, e := range b.append(evs...) {
			r.Apply(e)
		}
		want[nonce] = r
	}
	// An intent of another owner has no row.
	b.append(received("not-a-job"))
	return want
}

// TestOwnedProjectionRidesCatchUp: an owner's projection is folded by the
// writer and written behind the log; a log that stopped with rows not
// written has them after the next Open (catch-up), equal to a rebuild; and
// its start reads them, not the log.
func TestOwnedProjectionRidesCatchUp(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	want := ownedJobEvents(b, 8)
	var onDisk int
	require.NoError(t, b.log.ReadDB().Get(&onDisk, `SELECT COUNT(*) FROM beam_test_jobs`))
	require.Zero(t, onDisk, "a commit wrote the owner's rows with its events")

	path := crashImage(t, b.log)
	got, err := ownedRows(b.log, ctx)
	require.NoError(t, err)
	require.Equal(t, want, got)

	opened, rebuilt := openedAndRebuilt(t, path, ownedRows)
	require.Equal(t, want, opened, "catch-up folds the rows a stop left unwritten")
	require.Equal(t, want, rebuilt)
}

// TestNewOwnedProjectionIsFoldedFromTheLog: a log written before an
// owner's projection existed gets its rows folded from the whole log on
// Open.
func TestNewOwnedProjectionIsFoldedFromTheLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := ownedJobEvents(b, 5)
	b.reopen()
	_, err := b.log.Do(context.Background(), func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`DROP TABLE beam_test_jobs`)
		return err
	})
	require.NoError(t, err)
	b.reopen()
	got, err := ownedRows(b.log, context.Background())
	require.NoError(t, err)
	require.Equal(t, want, got)
}
