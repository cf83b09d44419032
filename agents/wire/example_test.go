package wire_test

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// ExampleSignIntent builds a beam/1 intent, signs it the way beam-protocol-sdk does, and verifies the
// frame a recipient receives.
func ExampleSignIntent() {
	seed := make([]byte, ed25519.SeedSize) // a fixed key keeps the example's output stable
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)

	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	f := wire.NewIntentFrame("procurement@acme.beam.directory", "partner-desk@northwind.beam.directory",
		"quote.request", json.RawMessage(`{"sku":"INV-240","quantity":240,"2":"index keys sort first"}`), now)
	f.Nonce = "example-nonce" // normally a random UUIDv4

	if err := wire.SignIntent(f, priv); err != nil {
		fmt.Println("sign:", err)
		return
	}
	in, _ := f.SigningInput()
	fmt.Println(string(in))

	frame, _ := f.DeliveryJSON()
	received, err := wire.DecodeIntentFrame(frame)
	if err != nil {
		fmt.Println("decode:", err)
		return
	}
	fmt.Println("verified:", received.Verify(pub) == nil)
	// Output:
	// {"type":"intent","from":"procurement@acme.beam.directory","to":"partner-desk@northwind.beam.directory","intent":"quote.request","payload":{"2":"index keys sort first","sku":"INV-240","quantity":240},"timestamp":"2026-03-30T15:00:00.000Z","nonce":"example-nonce"}
	// verified: true
}
