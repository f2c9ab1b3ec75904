// Package worker is the Agent Handler contract as Go code: Agent, the
// Event stream a turn yields and its constructors, Scope and Prompt, the
// busy policies, and the built-in echo agent. It is what an agent author
// imports, and it links no NATS, no bbolt and no HTTP framework.
//
// The machinery that runs agents lives below it: worker/pool consumes
// admitted submissions and runs one turn at a time per session;
// worker/natsbus is the NATS plumbing (relay, leases, delta bus, embedded
// server).
package worker
