// Package pool runs the agents behind conversations: it consumes admitted
// submissions (doorbells from worker/natsbus), holds each session's lease,
// runs one turn at a time per session in stored order, and writes the
// turn's entries and settlements to the log. Every decision (is this
// submission still admitted? which ones does the next turn answer?) is
// taken from the log.
//
// A turn whose agent asks a person to approve tool calls
// (worker.EventApprovalRequested) ends waiting, not settled (log
// Write.Await): no turn holds a waiting submission. Once every request
// is decided (log DB.Decide, or the agent's approvalTimeout, whose timers
// run in the pool that owns the log), the submission is dispatched again
// and a new turn resumes it with the decisions.
package pool
