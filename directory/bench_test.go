package directory

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// BenchmarkWebSocketRoundTrip measures signed intents relayed WS → WS with
// results, 64 in flight, durable log (synchronous=NORMAL in this harness).
// Frames are signed before the timer starts; the recipient answers with
// unsigned results so that the client side costs little.
func BenchmarkWebSocketRoundTrip(b *testing.B) {
	tb := setup(b)
	alice, bob := tb.register("alice"), tb.register("bob")
	ac, bc := tb.connect(alice), tb.connect(bob)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-bc.msgs:
				if m.Type != "intent" {
					continue
				}
				var f struct {
					Nonce string `json:"nonce"`
				}
				_ = json.Unmarshal(m.Frame, &f)
				res, _ := wire.Result{Success: true, Nonce: f.Nonce, Payload: json.RawMessage(`{"ok":true}`)}.Build(time.Now(), nil)
				_ = bc.conn.Write(ctx, websocket.MessageText, append(append([]byte(`{"type":"result","frame":`), res...), '}'))
			}
		}
	}()
	msgs := make([][]byte, b.N)
	for i := range msgs {
		f := tb.frame(alice, bob.id, "task.delegate", `{"i":1,"text":"benchmark payload"}`)
		msgs[i] = []byte(`{"type":"intent","frame":` + string(frameJSON(b, f)) + `}`)
	}
	const window = 64
	b.ResetTimer()
	sent, got := 0, 0
	for got < b.N {
		for sent < b.N && sent-got < window {
			require.NoError(b, ac.conn.Write(ctx, websocket.MessageText, msgs[sent]))
			sent++
		}
		m := ac.next()
		if m.Type == "result" {
			got++
		} else {
			b.Fatalf("unexpected message %s", m.raw)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "intents/s")
	counts, err := tb.log.CountByState(context.Background())
	require.NoError(b, err)
	require.EqualValues(b, b.N, counts[tracing.Acked])
}
