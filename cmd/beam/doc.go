// Command beam runs and drives a Beam agent directory.
//
//	beam serve                 run a directory (SQLite in --data-dir, embedded NATS)
//	beam keygen                generate an agent identity file
//	beam register              register that agent with a directory
//	beam send TO INTENT [JSON] send an intent and print the result
//	beam listen [--echo]       connect an agent and answer its intents
//	beam peer show-self|add|list|remove   federation peers
//	beam bench                 load-test a directory and print intents/s, latency, CPU, RSS
//	beam version               print the version
//	beam replay                rebuild the projections from the event log
//	beam trace NONCE           print the events of one intent
//	beam import PATH           append the intents of a Beam TypeScript database
//
// Every flag has a BEAM_* environment equivalent, shown by --help.
package main
