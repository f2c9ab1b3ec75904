// Package pool runs the agents behind conversations: it consumes admitted
// submissions (doorbells from worker/natsbus), holds each session's lease,
// runs one turn at a time per session in stored order, and writes the
// turn's entries and settlements to the log. Every decision (is this
// submission still admitted? which ones does the next turn answer?) is
// taken from the log.
package pool
