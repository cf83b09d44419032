package cluster

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Each node's event log is shipped to the log stream BEAM_LOG_<token>
// (subjects beam.cluster.<token>.log.<log ID>), one message per committed
// writer batch, in commit order, so that another node can take the log
// over when its node is gone (takeover.go). A message carries the batch as
// the log wrote it (the cluster never decodes it), the log position of its
// last event (headerLogLast) and a seal by the directory key over the log
// ID, that position and the batch's digest (headerSeal), so a client of
// the stream without the key cannot add a batch a taker imports.
//
// Publishing is serial per log: each message expects the stream sequence of
// the log's previous message on its subject
// (Nats-Expected-Last-Subject-Sequence). A taker fences the subject with a
// sealed marker message; the log's next publish then fails and the node
// learns that its log was taken over (ErrFenced).
//
// The stream keeps a log's messages for as long as the log lives (no age
// limit: they are the log's replica, which grows with the log as its
// SQLite file does); once a takeover is done the subject is purged down to
// its last message, the fence.

// Log is this node's event log as the cluster ships and imports it
// (tracing.Log in cluster mode).
type Log interface {
	// ID names the log: 1-64 of A-Z, a-z, 0-9, '_' and '-', created with
	// the log file.
	ID() string
	// Unshipped calls fn, in commit order, for every committed batch whose
	// last event is after afterSeq. It is called at start and from
	// Replicate (after a batch failed to ship), so it must read committed
	// batches without waiting for the log's writer.
	Unshipped(ctx context.Context, afterSeq int64, fn func(batch []byte, lastSeq int64) error) error
	// Import applies a batch of log logID, written by node, found at
	// streamSeq in the log stream, to this log. It must be idempotent: a
	// log remembers, per source log, the last stream sequence it imported,
	// and skips what it already has.
	Import(ctx context.Context, logID, node string, streamSeq uint64, batch []byte) error
}

// ErrFenced is the error of a node whose log another node took over: it
// must stop acknowledging and start again with a new, empty log. The
// tracing log's replicator reports it as tracing.ErrFenced.
var ErrFenced = errors.New("cluster: this node's log was taken over by another node")

// maxLogBatch is the largest batch Replicate ships as one message; the log
// must split larger ones. The rest of a NATS message (1 MiB) is its headers.
const maxLogBatch = 1<<20 - 8<<10

// Headers of the log stream's messages.
const (
	// headerLogLast is the log position of a batch's last event.
	headerLogLast = "Beam-Log-Last"
	// headerLogFence marks a taker's fence; its value is the fence's seal.
	headerLogFence = "Beam-Log-Fence"
)

var logIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// logBatch is the sealed header of a shipped batch.
type logBatch struct {
	Log    string `json:"log"`
	Node   string `json:"node"`
	Last   int64  `json:"last"`
	Digest string `json:"digest"`
}

// logFence is the sealed header of a fence.
type logFence struct {
	Log   string `json:"log"`
	Taker string `json:"taker"`
}

// shipper is the state of this node's log in the stream.
type shipper struct {
	// pmu guards ready and missed. ready: the tail was shipped at start;
	// before it, Replicate leaves batches to that tail, and notes in
	// missed that the log committed one the tail may not have read yet.
	// Replicate never waits for the tail (which may need the log's writer
	// to read it).
	pmu    sync.Mutex
	ready  bool
	missed bool

	// mu serializes publishing.
	mu sync.Mutex
	// behind: a batch failed to ship; the next Replicate ships what the
	// stream misses first, so the stream never skips a batch.
	behind bool
	// seq is the stream sequence of the subject's last message, last the
	// log position of the last batch of this log shipped.
	seq  uint64
	last int64

	fenceOnce sync.Once
	fenced    chan struct{}
}

func (n *Node) logPrefix() string { return "beam.cluster." + Token(n.cfg.Domain) + ".log." }

func (n *Node) logSubject(logID string) string { return n.logPrefix() + logID }

// openLogs creates the log stream and the takeover bucket and refuses to
// go on when this node's log was taken over.
func (n *Node) openLogs(ctx context.Context) error {
	id := n.cfg.Log.ID()
	if !logIDPattern.MatchString(id) {
		return fmt.Errorf("cluster: log id %q: want 1-64 of A-Z, a-z, 0-9, '_' and '-'", id)
	}
	name := "BEAM_LOG_" + Token(n.cfg.Domain)
	scfg := jetstream.StreamConfig{
		Name: name, Subjects: []string{n.logPrefix() + "*"}, Replicas: n.Replicas(),
		Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardNew,
		MaxMsgSize: 1 << 20, Duplicates: 2 * time.Minute,
	}
	stream, err := n.createStream(ctx, scfg)
	if err != nil {
		return err
	}
	n.logs = stream
	kv, err := createKV(ctx, n.js, jetstream.KeyValueConfig{
		Bucket: "BEAM_TAKEOVER_" + Token(n.cfg.Domain), Replicas: n.Replicas(), Storage: jetstream.FileStorage,
	})
	if err != nil {
		return err
	}
	n.take.kv = kv
	if rec, _, err := n.takeoverOf(ctx, id); err != nil {
		return err
	} else if rec != nil {
		n.fence()
		return fmt.Errorf("cluster: log %s taken over by %s at %s: %w", id, rec.Taker,
			rec.Started.Format(time.RFC3339), ErrFenced)
	}
	// The fence outlives the record (a bucket client may delete that).
	if end, err := n.subjectEnd(ctx, id); err != nil {
		return err
	} else if end.fenced {
		n.fence()
		return fmt.Errorf("cluster: log %s is fenced: %w", id, ErrFenced)
	}
	return nil
}

// shipTail reads where this log's subject ends and ships the log's batches
// after it, before the node serves; from then on Replicate ships each
// batch.
func (n *Node) shipTail(ctx context.Context) error {
	s := &n.ship
	s.mu.Lock()
	defer s.mu.Unlock()
	id := n.cfg.Log.ID()
	end, err := n.subjectEnd(ctx, id)
	if err != nil {
		return err
	}
	if end.fenced {
		n.fence()
		return fmt.Errorf("cluster: log %s is fenced: %w", id, ErrFenced)
	}
	s.seq, s.last = end.seq, end.last
	from := s.last
	for {
		if err := n.shipAfter(ctx, s.last); err != nil {
			return err
		}
		// Batches committed while the tail shipped: read the log again.
		// Once ready, Replicate ships each batch itself (after this
		// returns: s.mu is held).
		s.pmu.Lock()
		missed := s.missed
		s.missed, s.ready = false, !missed
		s.pmu.Unlock()
		if !missed {
			break
		}
	}
	n.lg.Info("log shipped", "log", id, "from", from, "last", s.last, "streamSeq", s.seq)
	return nil
}

// Replicate ships one committed batch of this node's log, whose last event
// is at lastSeq, and returns once the stream stored it (tracing's
// Replicator; called serially, in commit order). Before the node started,
// a batch is left to the tail Start ships; a batch already shipped (by
// that tail) is not shipped again; after a batch failed to ship, the next
// call ships the batches the stream misses first. An error wrapping
// ErrFenced means the log was taken over.
func (n *Node) Replicate(ctx context.Context, batch []byte, lastSeq int64) error {
	if n.isFenced() {
		return fmt.Errorf("cluster: replicate: %w", ErrFenced)
	}
	s := &n.ship
	s.pmu.Lock()
	ready := s.ready
	if !ready {
		s.missed = true
	}
	s.pmu.Unlock()
	if !ready {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n.isFenced() {
		return fmt.Errorf("cluster: replicate: %w", ErrFenced)
	}
	if s.behind {
		if err := n.shipAfter(ctx, s.last); err != nil {
			return err
		}
		s.behind = false
	}
	if lastSeq <= s.last {
		return nil // shipped with the tail, or just now
	}
	err := n.publishBatch(ctx, batch, lastSeq)
	if err != nil && !errors.Is(err, ErrFenced) {
		s.behind = true
	}
	return err
}

// shipAfter ships the log's committed batches after position after, in
// order (s.mu held).
func (n *Node) shipAfter(ctx context.Context, after int64) error {
	s := &n.ship
	err := n.cfg.Log.Unshipped(ctx, after, func(batch []byte, lastSeq int64) error {
		if lastSeq <= s.last {
			return nil
		}
		return n.publishBatch(ctx, batch, lastSeq)
	})
	if err != nil {
		return fmt.Errorf("cluster: ship the log after %d: %w", after, err)
	}
	return nil
}

// Fenced is closed when this node learns that its log was taken over; the
// node must then stop serving (beam.ErrLogTakenOver). Nil without a Log.
func (n *Node) Fenced() <-chan struct{} { return n.ship.fenced }

func (n *Node) fence() {
	n.ship.fenceOnce.Do(func() {
		close(n.ship.fenced)
		n.lg.Error("this node's log was taken over by another node: it acknowledges nothing more", "log", n.cfg.Log.ID())
	})
}

func (n *Node) isFenced() bool {
	select {
	case <-n.ship.fenced:
		return true
	default:
		return false
	}
}

// publishBatch publishes a batch after the subject's last message (s.mu
// held). While the stream has no leader it tries again for up to
// publishPatience, with a message ID so that a retry of a publish whose
// acknowledgement was lost is dropped as a duplicate. A publish refused
// because the subject moved on is resolved by its last message: this very
// batch (its acknowledgement was lost), a fence or a takeover record
// (ErrFenced), or a message no member sealed, which is skipped.
func (n *Node) publishBatch(ctx context.Context, batch []byte, lastSeq int64) error {
	if len(batch) > maxLogBatch {
		return fmt.Errorf("cluster: log batch of %d bytes: at most %d", len(batch), maxLogBatch)
	}
	s := &n.ship
	id := n.cfg.Log.ID()
	sum := digest(batch)
	tok, err := n.seal(typLogBatch, logBatch{Log: id, Node: n.cfg.NodeID, Last: lastSeq, Digest: sum})
	if err != nil {
		return err
	}
	msg := nats.NewMsg(n.logSubject(id))
	msg.Data = batch
	msg.Header.Set(headerLogLast, strconv.FormatInt(lastSeq, 10))
	msg.Header.Set(headerSeal, tok)
	msgID := id + "-" + strconv.FormatInt(lastSeq, 10)
	deadline := time.Now().Add(publishPatience)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err := n.js.PublishMsg(actx, msg, jetstream.WithMsgID(msgID), jetstream.WithExpectLastSequencePerSubject(s.seq))
		cancel()
		if err == nil {
			s.seq, s.last = ack.Sequence, lastSeq
			return nil
		}
		if wrongLastSequence(err) {
			end, rerr := n.subjectEnd(ctx, id)
			switch {
			case rerr != nil:
				err = rerr
			case end.fenced:
				n.fence()
				return fmt.Errorf("cluster: log %s: %w", id, ErrFenced)
			case end.last >= lastSeq:
				// Stored (only this node seals the log's batches, and a
				// copy is not counted); its acknowledgement was lost.
				s.seq, s.last = end.seq, lastSeq
				return nil
			default:
				if rec, _, terr := n.takeoverOf(ctx, id); terr == nil && rec != nil {
					n.fence()
					return fmt.Errorf("cluster: log %s taken over by %s: %w", id, rec.Taker, ErrFenced)
				} else if terr != nil {
					err = terr
				} else {
					n.refuse("log", fmt.Errorf("message %d on the log's subject", end.seq), "log", id)
					s.seq = end.seq
					if time.Now().After(deadline) {
						return fmt.Errorf("cluster: ship log batch %d: the subject keeps moving", lastSeq)
					}
					continue
				}
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("cluster: ship log batch %d: %w", lastSeq, err)
		}
		n.lg.Info("log stream unavailable; retrying", "err", err)
		sleep(ctx, 250*time.Millisecond)
	}
}

func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// subjectEnd is what a log's subject ends with.
type subjectEnd struct {
	// seq is the stream sequence of the subject's last message (0: none).
	seq uint64
	// last is the position of the log's last sealed batch.
	last int64
	// fenced: the subject holds a sealed fence of the log.
	fenced bool
}

// subjectEnd reads the end of logID's subject. When its last message is
// not a sealed batch or fence (someone without the key wrote it), the
// subject is read from its start for the last sealed batch.
func (n *Node) subjectEnd(ctx context.Context, logID string) (subjectEnd, error) {
	var end subjectEnd
	raw, err := n.lastLogMsg(ctx, logID)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return end, nil
	}
	if err != nil {
		return end, err
	}
	end.seq = raw.Sequence
	if n.openFence(logID, raw.Header) == nil {
		end.fenced = true
		return end, nil
	}
	if _, b, err := n.openBatch(logID, raw.Header, raw.Data); err == nil {
		end.last = b.Last
		return end, nil
	}
	err = n.readLog(ctx, logID, end.seq, func(m logMsg) (bool, error) {
		if m.fence {
			end.fenced = true
			return false, nil
		}
		end.last = m.batch.Last
		return true, nil
	})
	return end, err
}

// lastLogMsg gets the last message of logID's subject, retrying while the
// stream has no leader for up to publishPatience.
func (n *Node) lastLogMsg(ctx context.Context, logID string) (*jetstream.RawStreamMsg, error) {
	deadline := time.Now().Add(publishPatience)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		raw, err := n.logs.GetLastMsgForSubject(actx, n.logSubject(logID))
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || ctx.Err() != nil || time.Now().After(deadline) {
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				err = fmt.Errorf("cluster: read the end of log %s: %w", logID, err)
			}
			return raw, err
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// openBatch verifies a log stream message as a batch of logID sealed by a
// member, and returns the sealing node and the batch header.
func (n *Node) openBatch(logID string, h nats.Header, data []byte) (string, logBatch, error) {
	var b logBatch
	err := n.openAs(typLogBatch, []byte(h.Get(headerSeal)), &b, func() string { return b.Node })
	switch {
	case err != nil:
	case b.Log != logID:
		err = fmt.Errorf("a batch of log %s on the subject of %s", b.Log, logID)
	case h.Get(headerLogLast) != strconv.FormatInt(b.Last, 10):
		err = fmt.Errorf("batch header says %q, seal %d", h.Get(headerLogLast), b.Last)
	case b.Digest != digest(data):
		err = errors.New("batch does not match its seal")
	}
	if err != nil {
		return "", logBatch{}, err
	}
	return b.Node, b, nil
}

// openFence verifies a message's header as a fence of logID sealed by a
// member.
func (n *Node) openFence(logID string, h nats.Header) error {
	tok := h.Get(headerLogFence)
	if tok == "" {
		return errors.New("not a fence")
	}
	var f logFence
	if err := n.openAs(typLogFence, []byte(tok), &f, func() string { return f.Taker }); err != nil {
		return err
	}
	if f.Log != logID {
		return fmt.Errorf("a fence of log %s on the subject of %s", f.Log, logID)
	}
	return nil
}

// logMsg is one sealed message of a log's subject.
type logMsg struct {
	seq   uint64
	node  string
	batch logBatch
	data  []byte
	fence bool
}

// readLog reads logID's subject in order, up to stream sequence upTo
// included, and calls fn with each sealed batch and fence until fn returns
// false. Batches whose seal does not verify, or whose position is not
// after the previous batch's (a copy), are skipped and counted.
func (n *Node) readLog(ctx context.Context, logID string, upTo uint64, fn func(logMsg) (bool, error)) error {
	if upTo == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, logReadTimeout)
	defer cancel()
	cons, err := n.logs.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{n.logSubject(logID)}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("cluster: read log %s: %w", logID, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("cluster: read log %s: %w", logID, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	var last int64
	for {
		msg, err := it.Next()
		if err != nil {
			return fmt.Errorf("cluster: read log %s: %w", logID, errors.Join(err, ctx.Err()))
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("cluster: read log %s: %w", logID, err)
		}
		m := logMsg{seq: meta.Sequence.Stream, data: msg.Data()}
		if m.seq > upTo {
			return nil
		}
		ok := true
		if n.openFence(logID, msg.Headers()) == nil {
			m.fence = true
		} else if node, b, err := n.openBatch(logID, msg.Headers(), msg.Data()); err != nil {
			n.refuse("log", err, "log", logID, "seq", m.seq)
			ok = false
		} else if b.Last <= last {
			n.refuse("log", fmt.Errorf("batch at %d after one at %d: a copy", b.Last, last), "log", logID, "seq", m.seq)
			ok = false
		} else {
			m.node, m.batch, last = node, b, b.Last
		}
		if ok {
			more, err := fn(m)
			if err != nil || !more {
				return err
			}
		}
		if m.seq == upTo {
			return nil
		}
	}
}

// logReadTimeout bounds one read of a log's subject.
const logReadTimeout = 2 * time.Minute
