package beam_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
)

// A program embeds a directory, and two agents register with it and
// exchange an intent.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "beam-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The default policy lets only approved members of an org message each
	// other; this example opens the directory to every registered sender.
	srv, err := beam.New(ctx, beam.Config{DataDir: dir, DefaultPolicy: "allow", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Shutdown(ctx)
	url := "http://" + ln.Addr().String()

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
	// Output:
	// true {"reply":"hello, alice@acme.beam.directory"}
}
