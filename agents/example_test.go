package agents_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
)

// An identity is generated once and kept in a file in the format the
// TypeScript SDK's BeamIdentity.export() uses.
func ExampleGenerateIdentity() {
	dir, err := os.MkdirTemp("", "beam-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "assistant.json")

	id, err := agents.GenerateIdentity("assistant@acme.beam.directory")
	if err != nil {
		log.Fatal(err)
	}
	if err := id.Save(path); err != nil {
		log.Fatal(err)
	}
	loaded, err := agents.LoadIdentity(path)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(loaded.BeamID)
	fmt.Println(strings.HasPrefix(loaded.PublicKeyBase64(), "MCowBQYDK2VwAyEA"))
	// Output:
	// assistant@acme.beam.directory
	// true
}

// A client registers its agent, connects, answers intents and sends its own.
// (Examples below need a running directory, so they are compiled, not run.)
func ExampleNewClient() {
	ctx := context.Background()
	id, err := agents.LoadIdentity("assistant.json")
	if err != nil {
		log.Fatal(err)
	}
	c, err := agents.NewClient(agents.ClientConfig{
		DirectoryURL: "http://127.0.0.1:3100",
		Identity:     id,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := c.Register(ctx, "Assistant", []string{"conversation.message"})
	if err != nil {
		log.Fatal(err)
	}
	if res.APIKey != "" { // first registration: keep the key with the identity
		id.APIKey = res.APIKey
		if err := id.Save("assistant.json"); err != nil {
			log.Fatal(err)
		}
	}
	if err := c.Connect(ctx); err != nil {
		log.Fatal(err)
	}
	reply, err := c.Talk(ctx, "echo@beam.directory", "hello")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(reply) // Echo: hello
}

// Handlers answer incoming intents with Success, Failure or Accept.
func ExampleClient_Handle() {
	var c *agents.Client // from NewClient
	c.Handle("quote.request", func(ctx context.Context, in *agents.Intent) agents.Reply {
		var req struct {
			SKU      string `json:"sku"`
			Quantity int    `json:"quantity"`
		}
		if err := in.Bind(&req); err != nil {
			return agents.Failure("BAD_REQUEST", err.Error())
		}
		if req.Quantity > 1000 {
			return agents.Failure("QUANTITY_TOO_LARGE", "at most 1000 units per quote")
		}
		return agents.Success(map[string]any{"sku": req.SKU, "unitPriceEur": 184})
	})
	// Long work: acknowledge now, finish later.
	c.Handle("task.delegate", func(ctx context.Context, in *agents.Intent) agents.Reply {
		return agents.Accept()
	})
}

// Send returns the result frame; failures are *agents.Error with a code.
func ExampleClient_Send() {
	var c *agents.Client // from NewClient
	ctx := context.Background()
	res, err := c.Send(ctx, "partner-desk@northwind.beam.directory", "quote.request",
		map[string]any{"sku": "INV-240", "quantity": 240})
	var e *agents.Error
	switch {
	case errors.As(err, &e) && e.Code == "OFFLINE":
		fmt.Println("partner desk is offline")
	case err != nil:
		log.Fatal(err)
	case wire.IsAsyncAcceptance(res):
		fmt.Println("accepted, result follows later")
	default:
		fmt.Println(string(res.Payload))
	}
}
