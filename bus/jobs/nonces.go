package jobs

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/beamdir/beam/tracing"
)

// Used nonces of signed requests outlive a restart: a replay stays refused
// after one while an honest signature made before the start is accepted.
// A nonce is stored before the request is answered, at no extra commit
// when the request writes: in the job event its change appends
// (details.job.signedNonce, which the log folds into the job's beam_jobs
// row while it can still be replayed, read back at start by loadJobs) or in the
// same transaction as its table write (KV). Requests that write nothing
// store it in intent_bus_nonces just before their answer (nonceWriter).

// signedNonce is the nonce of the signed request being served.
type signedNonce struct {
	digest, nonce string
	expires       int64 // unix s
	saved         bool
}

// key is the nonce as the job event records it: the key digest (hex) and
// the nonce.
func (n *signedNonce) key() string { return n.digest + ":" + n.nonce }

type nonceCtxKey struct{}

// unsavedNonce returns the request's nonce while it is not stored yet.
func unsavedNonce(ctx context.Context) *signedNonce {
	n, _ := ctx.Value(nonceCtxKey{}).(*signedNonce)
	if n == nil || n.saved {
		return nil
	}
	return n
}

// append appends evs; the request's unsaved nonce rides in the first job
// event.
func (s *Service) append(ctx context.Context, evs ...tracing.Event) ([]tracing.Event, error) {
	n := unsavedNonce(ctx)
	if n == nil {
		return s.log.Append(ctx, evs...)
	}
	done, err := s.log.Append(ctx, stampNonce(evs, n)...)
	n.saved = err == nil
	return done, err
}

// doOps is log.DoOps; the request's unsaved nonce rides in the first job
// event, or is stored by an op of the same call when there is none.
func (s *Service) doOps(ctx context.Context, ops []tracing.Op, evs ...tracing.Event) ([]tracing.Event, error) {
	n := unsavedNonce(ctx)
	if n == nil {
		return s.log.DoOps(ctx, ops, evs...)
	}
	stamped := stampNonce(evs, n)
	if !hasJobEvent(stamped, n) {
		ops = append([]tracing.Op{nonceOp(n)}, ops...)
	}
	done, err := s.log.DoOps(ctx, ops, stamped...)
	n.saved = err == nil
	return done, err
}

// stampNonce records n in the details of the first job event of evs (a
// copy: events may share their details).
func stampNonce(evs []tracing.Event, n *signedNonce) []tracing.Event {
	for i := range evs {
		if evs[i].Details.Job != nil {
			jd := *evs[i].Details.Job
			jd.SignedNonce = n.key()
			evs[i].Details.Job = &jd
			break
		}
	}
	return evs
}

func hasJobEvent(evs []tracing.Event, n *signedNonce) bool {
	for _, ev := range evs {
		if ev.Details.Job != nil && ev.Details.Job.SignedNonce == n.key() {
			return true
		}
	}
	return false
}

// rememberNonce takes the nonce a job event recorded (at its time at) back
// into the used nonces, while it is not expired. Caller is loading.
func (s *Service) rememberNonce(key string, at time.Time, now int64) {
	digest, nonce, ok := strings.Cut(key, ":")
	exp := at.Add(2 * signatureWindow).Unix()
	if !ok || exp <= now {
		return
	}
	s.nonces.Use(digest+"\x00"+nonce, time.Unix(now, 0), time.Unix(exp, 0))
}

// nonceWriter stores the request's nonce before the first byte of an
// answer whose request stored it nowhere yet (a read, a claim that found
// no work, an error); when that fails the answer becomes 503
// database_busy, which is safe because such a request changed nothing.
type nonceWriter struct {
	http.ResponseWriter
	s       *Service
	ctx     context.Context
	n       *signedNonce
	checked bool
	failed  bool
}

func (w *nonceWriter) ensure() {
	if w.checked || w.n == nil || w.n.saved {
		return
	}
	w.checked = true
	// The request's own deadline may be over (an error is written after
	// dispatch returned): the write gets a fresh one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), writeWait)
	defer cancel()
	if _, err := w.s.log.DoOps(ctx, []tracing.Op{nonceOp(w.n)}); err != nil {
		w.failed = true
		// The handler's headers go with its answer.
		h := w.ResponseWriter.Header()
		clear(h)
		securityHeaders(h)
		problem(w.ResponseWriter, w.s.internal(err))
		return
	}
	w.n.saved = true
}

// WriteHeader stores the nonce first.
func (w *nonceWriter) WriteHeader(code int) {
	w.ensure()
	if !w.failed {
		w.ResponseWriter.WriteHeader(code)
	}
}

// Write stores the nonce first.
func (w *nonceWriter) Write(b []byte) (int, error) {
	w.ensure()
	if w.failed {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}
