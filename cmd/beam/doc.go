// Command beam runs and drives a Beam agent directory.
//
//	beam serve                     run a directory (SQLite in --data-dir; federation over NATS when asked)
//	beam keygen                    generate an agent identity file
//	beam register                  register that agent with a directory
//	beam send TO INTENT [JSON]     send an intent and print the result (--durable: through the bus)
//	beam approve MEMBER_ID         org owner: approve a member of the org
//	beam acl add|list|remove       let senders reach your agent
//	beam listen [--echo]           connect an agent and answer its intents
//	beam poll, beam ack ID         read an agent's bus inbox and record outcomes
//	beam dead-letters, requeue ID  operator: list and requeue dead-lettered bus messages
//	beam mesh create|get|list|watch|cancel|pause|resume|trace|dead-letters|requeue   pipelines
//	beam cluster init              make every node's data directory of a new cluster (key, route credentials)
//	beam peer show-self|add|list|remove|nats-user   federation peers
//	beam trace NONCE               print the events of one intent or job (--data-dir or --url)
//	beam replay                    rebuild the projections from the event log
//	beam import PATH               append the intents of a Beam TypeScript database
//	beam bench                     load-test a directory (ws, http, bus, federation, chaos)
//	beam version                   print the version
//
// `beam help` lists every command; `beam COMMAND --help` lists its flags and
// their BEAM_* environment equivalents.
package main
