package beam_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
)

// A program embeds a directory with its job bus on, two agents register
// with it and exchange an intent, and a worker takes a job from the bus.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "beam-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The default policy lets only approved members of an org message each
	// other; this example opens the directory to every registered sender.
	// The Intent Protocol job bus is off unless enabled; its secret is
	// generated once and kept in the data directory unless set.
	srv, err := beam.New(ctx, beam.Config{
		DataDir:       dir,
		DefaultPolicy: "allow",
		JobBus:        beam.JobBus{Enabled: true},
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	jobLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.ServeJobBus(jobLn) }()
	jobBusURL := "http://" + jobLn.Addr().String()

	// join registers an agent, keeps its API key and connects it.
	join := func(beamID, name string) *agents.Client {
		id, err := agents.GenerateIdentity(beamID)
		if err != nil {
			log.Fatal(err)
		}
		c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: url, Identity: id})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := c.Register(ctx, name, []string{"conversation.message"}); err != nil {
			log.Fatal(err)
		}
		if err := c.Connect(ctx); err != nil {
			log.Fatal(err)
		}
		return c
	}
	bob := join("bob@acme.beam.directory", "Bob")
	defer bob.Close()
	bob.Handle("conversation.message", func(_ context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]string{"reply": "hello, " + in.From})
	})
	alice := join("alice@acme.beam.directory", "Alice")
	defer alice.Close()

	res, err := alice.Send(ctx, "bob@acme.beam.directory", "conversation.message", map[string]string{"message": "hi"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Success, string(res.Payload))

	// A client publishes a job on the bus and a worker claims it, both
	// presenting the bus secret.
	secret, _ := srv.JobBusSecret()
	jobBus := func(method, path, body string) []byte {
		req, err := http.NewRequestWithContext(ctx, method, jobBusURL+path, strings.NewReader(body))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-KEY", secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode >= 300 {
			log.Fatal(resp.Status, string(b), err)
		}
		return b
	}
	jobBus(http.MethodPost, "/intent", `{"goal":"greet","payload":{"name":"Carol"}}`)
	var job struct {
		Goal    string          `json:"goal"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(jobBus(http.MethodPost, "/claim?goal=greet", ""), &job); err != nil {
		log.Fatal(err)
	}
	fmt.Println(job.Goal, string(job.Payload))
	// Output:
	// true {"reply":"hello, alice@acme.beam.directory"}
	// greet {"name":"Carol"}
}
