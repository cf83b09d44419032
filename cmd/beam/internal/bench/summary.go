package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Summary is the outcome of a run. Its JSON names intents_per_second,
// p50_ms, p90_ms, p99_ms, errors, server_cpu_ms_per_intent and
// server_rss_mb are a stable interface.
type Summary struct {
	Mode         Mode    `json:"mode"`
	Count        int     `json:"count"`
	Concurrency  int     `json:"concurrency"`
	Rate         float64 `json:"rate,omitempty"`
	DurationS    float64 `json:"duration_s,omitempty"`
	Senders      int     `json:"senders"`
	Recipients   int     `json:"recipients"`
	PayloadBytes int     `json:"payload_bytes"`

	OK               int64            `json:"ok"`
	Errors           int64            `json:"errors"`
	ErrorCodes       map[string]int64 `json:"error_codes,omitempty"`
	RecipientErrors  int64            `json:"recipient_errors,omitempty"`
	ElapsedS         float64          `json:"elapsed_s"`
	IntentsPerSecond float64          `json:"intents_per_second"`
	P50ms            float64          `json:"p50_ms"`
	P90ms            float64          `json:"p90_ms"`
	P99ms            float64          `json:"p99_ms"`
	Maxms            float64          `json:"max_ms"`
	Meanms           float64          `json:"mean_ms"`

	// Server fields are null when the server's process could not be read.
	ServerPID            *int     `json:"server_pid"`
	ServerCPUmsPerIntent *float64 `json:"server_cpu_ms_per_intent"`
	ServerCPUUtil        *float64 `json:"server_cpu_cores,omitempty"`
	ServerRSSMB          *float64 `json:"server_rss_mb"`
	ServerRSSEndMB       *float64 `json:"server_rss_end_mb,omitempty"`
	ServerThreads        *int     `json:"server_threads,omitempty"`

	// Ed25519VerifyMs is the median cost of one Ed25519 verification
	// measured by the bench in the same run (verifyFloor); ServerCPUVerifies
	// is server_cpu_ms_per_intent as a multiple of it.
	Ed25519VerifyMs   *float64 `json:"ed25519_verify_ms"`
	ServerCPUVerifies *float64 `json:"server_cpu_verifies_per_intent,omitempty"`

	// Accepted and SentPerSecond (bus mode) count the sends the bus
	// accepted; IntentsPerSecond counts the messages acked.
	Accepted      *int64   `json:"accepted,omitempty"`
	SentPerSecond *float64 `json:"sent_per_second,omitempty"`

	// Hops, HopsPerSecond and ServerCPUmsPerHop (mesh mode): an intent is
	// one envelope of Hops hops; latency is create → succeeded.
	Hops              int      `json:"hops,omitempty"`
	HopsPerSecond     *float64 `json:"hops_per_second,omitempty"`
	ServerCPUmsPerHop *float64 `json:"server_cpu_ms_per_hop,omitempty"`

	// PeerServer fields describe the second directory of a federation run.
	PeerServerPID            *int     `json:"peer_server_pid,omitempty"`
	PeerServerCPUmsPerIntent *float64 `json:"peer_server_cpu_ms_per_intent,omitempty"`
	PeerServerRSSMB          *float64 `json:"peer_server_rss_mb,omitempty"`

	// ClusterNodes (a cluster run) has one entry per node; the server
	// fields above are then summed over the nodes (server_rss_mb is the sum
	// of their peaks).
	ClusterNodes []nodeFigures `json:"cluster_nodes,omitempty"`
	// SingleNode and VsSingleNode are the same run on one node and the
	// cluster's figures relative to it (beam bench --compare-single).
	SingleNode   *Summary `json:"single_node,omitempty"`
	VsSingleNode *ratios  `json:"vs_single_node,omitempty"`

	// IdleAgents is how many idle agents were asked for; IdleConnected how
	// many connected (fewer when the descriptor limits allow fewer; a note
	// says which).
	IdleAgents      int      `json:"idle_agents,omitempty"`
	IdleConnected   int      `json:"idle_agents_connected,omitempty"`
	IdleSourceAddrs int      `json:"idle_source_addrs,omitempty"`
	IdleConnectS    float64  `json:"idle_connect_s,omitempty"`
	ServerRSSIdleMB *float64 `json:"server_rss_idle_mb,omitempty"`
	// ServerRSSBeforeIdleMB is the server's RSS before the idle agents
	// registered; ServerRSSKBPerIdleAgent the growth per connected agent.
	ServerRSSBeforeIdleMB   *float64 `json:"server_rss_before_idle_mb,omitempty"`
	ServerRSSKBPerIdleAgent *float64 `json:"server_rss_kb_per_idle_agent,omitempty"`
	// ServerRSSIdleExtrapolatedMB, set only when fewer agents connected
	// than were asked for, is the RSS before plus the measured growth per
	// agent times the number asked for: an extrapolation, not a
	// measurement.
	ServerRSSIdleExtrapolatedMB *float64 `json:"server_rss_idle_extrapolated_mb,omitempty"`
	// IdleSettleS is how long the idle agents stayed idle before the
	// settled reading; ServerRSSIdleSettledMB, ServerRSSKBPerIdleAgentSettled
	// and ServerRSSIdleSettledExtrapolatedMB are the three figures above
	// read then.
	IdleSettleS                        float64  `json:"idle_settle_s,omitempty"`
	ServerRSSIdleSettledMB             *float64 `json:"server_rss_idle_settled_mb,omitempty"`
	ServerRSSKBPerIdleAgentSettled     *float64 `json:"server_rss_kb_per_idle_agent_settled,omitempty"`
	ServerRSSIdleSettledExtrapolatedMB *float64 `json:"server_rss_idle_settled_extrapolated_mb,omitempty"`
	// ServerPerIdleAgent breaks the growth down (needs the operator token).
	ServerPerIdleAgent *idleFigures `json:"server_per_idle_agent,omitempty"`

	// ClientCPUmsPerIntent is the load generator's own CPU per intent.
	ClientCPUmsPerIntent *float64 `json:"client_cpu_ms_per_intent,omitempty"`

	SetupS float64  `json:"setup_s"`
	Notes  []string `json:"notes,omitempty"`
}

// fill sets the client-side figures from the recorded latencies.
func (s *Summary) fill(l latencies, elapsed time.Duration) {
	s.OK, s.Errors = l.OK, l.Errors
	for k, v := range l.ErrorCodes {
		s.ErrorCodes[k] = v
	}
	s.ElapsedS = round3(elapsed.Seconds())
	if elapsed > 0 {
		s.IntentsPerSecond = math.Round(float64(l.OK)/elapsed.Seconds()*10) / 10
	}
	s.P50ms = ms(percentile(l.Sorted, 0.50))
	s.P90ms = ms(percentile(l.Sorted, 0.90))
	s.P99ms = ms(percentile(l.Sorted, 0.99))
	s.Maxms = ms(l.Max)
	s.Meanms = ms(mean(l.Sorted))
}

// setServer sets the server figures from samples taken before and after
// the measured phase; intents is how many intents the phase sent.
func (s *Summary) setServer(before, after procSample, intents int64) {
	cpu := after.CPU - before.CPU
	if intents > 0 {
		v := round3(float64(cpu) / float64(time.Millisecond) / float64(intents))
		s.ServerCPUmsPerIntent = &v
	}
	if wall := after.At.Sub(before.At); wall > 0 {
		v := round3(float64(cpu) / float64(wall))
		s.ServerCPUUtil = &v
	}
	hwm, end := mb(after.HWM), mb(after.RSS)
	s.ServerRSSMB, s.ServerRSSEndMB = &hwm, &end
	th := after.Threads
	s.ServerThreads = &th
}

// setPeerServer sets the second directory's figures of a federation run.
func (s *Summary) setPeerServer(before, after procSample, intents int64) {
	if intents > 0 {
		v := round3(float64(after.CPU-before.CPU) / float64(time.Millisecond) / float64(intents))
		s.PeerServerCPUmsPerIntent = &v
	}
	hwm := mb(after.HWM)
	s.PeerServerRSSMB = &hwm
}

func mb(b int64) float64 { return math.Round(float64(b)/(1<<20)*10) / 10 }

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// WriteJSON writes s as one JSON object and a newline.
func (s *Summary) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode summary: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteTable writes s as a readable table.
func (s *Summary) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	opt := func(v *float64, unit string) string {
		if v == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.3g%s", *v, unit)
	}
	fmt.Fprintln(tw, "mode\tcount\tconc\tintents/s\tp50 ms\tp90 ms\tp99 ms\tmax ms\terrors\tsrv cpu ms/intent\tsrv peak rss MB")
	row := func(s *Summary, label string) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%s\t%s\n",
			string(s.Mode)+label, s.Count, s.Concurrency, s.IntentsPerSecond, s.P50ms, s.P90ms, s.P99ms, s.Maxms, s.Errors,
			opt(s.ServerCPUmsPerIntent, ""), opt(s.ServerRSSMB, ""))
	}
	if s.SingleNode != nil {
		row(s.SingleNode, " (1 node)")
		row(s, fmt.Sprintf(" (%d nodes)", len(s.ClusterNodes)))
	} else {
		row(s, "")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var extra []string
	if s.Rate > 0 {
		extra = append(extra, fmt.Sprintf("steady rate %.0f/s for %.0fs", s.Rate, s.DurationS))
	}
	extra = append(extra, fmt.Sprintf("%d senders, %d recipients, %.1fs measured, %.1fs setup", s.Senders, s.Recipients, s.ElapsedS, s.SetupS))
	if s.SentPerSecond != nil && s.Accepted != nil {
		extra = append(extra, fmt.Sprintf("bus accepted %d messages (%.0f/s sent); intents/s counts messages acked, latency is send → acked", *s.Accepted, *s.SentPerSecond))
	}
	if s.HopsPerSecond != nil && s.Mode == ModeA2A {
		extra = append(extra, fmt.Sprintf("a2a: %d hops per task, %.0f hops/s, server cpu %s ms/hop; intents/s counts tasks, latency is SendMessage → completed",
			s.Hops, *s.HopsPerSecond, opt(s.ServerCPUmsPerHop, "")))
	} else if s.HopsPerSecond != nil {
		extra = append(extra, fmt.Sprintf("mesh: %d hops per envelope, %.0f hops/s, server cpu %s ms/hop; intents/s counts envelopes, latency is create → succeeded",
			s.Hops, *s.HopsPerSecond, opt(s.ServerCPUmsPerHop, "")))
	}
	if s.PeerServerRSSMB != nil {
		extra = append(extra, fmt.Sprintf("peer directory: cpu %s ms/intent, peak rss %s MB", opt(s.PeerServerCPUmsPerIntent, ""), opt(s.PeerServerRSSMB, "")))
	}
	for i, n := range s.ClusterNodes {
		extra = append(extra, fmt.Sprintf("node %d %s: %d senders, %d recipients, cpu %s ms/intent, peak rss %s MB",
			i, n.URL, n.Senders, n.Recipients, opt(n.ServerCPUmsPerIntent, ""), opt(n.ServerRSSMB, "")))
	}
	if s.VsSingleNode != nil {
		extra = append(extra, s.VsSingleNode.String())
	}
	if s.ServerCPUUtil != nil {
		extra = append(extra, fmt.Sprintf("server used %.2f cores", *s.ServerCPUUtil))
	}
	if s.Ed25519VerifyMs != nil {
		extra = append(extra, fmt.Sprintf("one ed25519 verification here costs %.4f ms; the server spent %s of them per intent", *s.Ed25519VerifyMs, opt(s.ServerCPUVerifies, "")))
	}
	if s.ClientCPUmsPerIntent != nil {
		extra = append(extra, fmt.Sprintf("load generator used %.3f ms CPU per intent", *s.ClientCPUmsPerIntent))
	}
	if s.IdleAgents > 0 {
		extra = append(extra, s.idleLines()...)
	}
	if len(s.ErrorCodes) > 0 {
		codes := make([]string, 0, len(s.ErrorCodes))
		for k, v := range s.ErrorCodes {
			codes = append(codes, fmt.Sprintf("%s=%d", k, v))
		}
		slices.Sort(codes)
		extra = append(extra, "errors by code: "+strings.Join(codes, " "))
	}
	if s.RecipientErrors > 0 {
		extra = append(extra, fmt.Sprintf("recipients rejected %d deliveries", s.RecipientErrors))
	}
	extra = append(extra, s.Notes...)
	for _, e := range extra {
		if _, err := fmt.Fprintln(w, "  "+e); err != nil {
			return err
		}
	}
	return nil
}

// idleLines describe the idle agents' figures.
func (s *Summary) idleLines() []string {
	out := []string{fmt.Sprintf("%d idle agents connected (of %d asked for) from %d source addresses in %.1fs; server RSS before %s MB, with them %s MB, %s KB per idle agent",
		s.IdleConnected, s.IdleAgents, s.IdleSourceAddrs, s.IdleConnectS, num(s.ServerRSSBeforeIdleMB), num(s.ServerRSSIdleMB), num(s.ServerRSSKBPerIdleAgent))}
	if p := s.ServerPerIdleAgent; p != nil {
		out = append(out, fmt.Sprintf("per idle agent after a forced GC: heap %.0f B, goroutine stacks %.0f B, %.2f goroutines, free heap not yet returned %.0f B, RSS %.0f B",
			p.HeapBytes, p.StackBytes, p.Goroutines, p.FreeHeapBytes, p.RSSBytesAfterGC))
	}
	if s.ServerRSSIdleExtrapolatedMB != nil {
		out = append(out, fmt.Sprintf("EXTRAPOLATED, not measured: server RSS with %d idle agents ≈ %.1f MB (RSS before + %d × the measured growth per agent)",
			s.IdleAgents, *s.ServerRSSIdleExtrapolatedMB, s.IdleAgents))
	}
	if s.ServerRSSIdleSettledMB != nil {
		out = append(out, fmt.Sprintf("after %.0fs idle: server RSS %s MB, %s KB per idle agent",
			s.IdleSettleS, num(s.ServerRSSIdleSettledMB), num(s.ServerRSSKBPerIdleAgentSettled)))
	}
	if s.ServerRSSIdleSettledExtrapolatedMB != nil {
		out = append(out, fmt.Sprintf("EXTRAPOLATED, not measured: server RSS with %d idle agents after %.0fs idle ≈ %.1f MB",
			s.IdleAgents, s.IdleSettleS, *s.ServerRSSIdleSettledExtrapolatedMB))
	}
	return out
}

// num formats an optional figure with one decimal, or n/a.
func num(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", *v)
}
