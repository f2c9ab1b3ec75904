// Package httpagent is the http agent kind: a remote Agent Handler written
// in any language. Each turn is one POST of the request JSON to the
// agent's URL; the events come back in the response body, one JSON object
// per line (NDJSON) or per SSE data field. Cancelling the turn closes the
// request.
package httpagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"

	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agentwire"
	"github.com/convlog/convlog/worker/egress"
)

// defaultClient is an agent endpoint's: the operator named the URL, so
// loopback and private networks are allowed (a sidecar, a cluster
// service); metadata and link-local addresses and cross-origin redirects
// are not.
var defaultClient = egress.Policy{AllowPrivate: true}.Client()

// Agent posts each turn to URL.
type Agent struct {
	URL string
	// Headers are added to each request (e.g. Authorization).
	Headers map[string]string
	// Client defaults to a client without a timeout (a turn lasts as long
	// as the agent streams, and its context bounds it) that applies
	// egress.Policy{AllowPrivate: true} and follows only same-origin
	// redirects, so that a redirect never re-sends the turn and its
	// Headers to another host.
	Client *http.Client
}

// Invoke implements worker.Agent.
func (a *Agent) Invoke(ctx context.Context, scope worker.Scope, prompt worker.Prompt) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		body, err := json.Marshal(agentwire.NewRequest(scope, prompt))
		if err != nil {
			yield(worker.Failed("encode the request: "+err.Error(), false, agentwire.CodeAgentProtocol))
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // closes the request whatever ends the turn
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.URL, bytes.NewReader(body))
		if err != nil {
			yield(worker.Failed("the agent's url: "+err.Error(), false, agentwire.CodeAgentUnavailable))
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/x-ndjson, text/event-stream")
		for k, v := range a.Headers {
			req.Header.Set(k, v)
		}
		client := a.Client
		if client == nil {
			client = defaultClient
		}
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return // stopped: no terminal expected
			}
			if errors.Is(err, egress.ErrRefused) {
				yield(worker.Failed("the agent's url: "+err.Error(), false, egress.CodeRefused))
				return
			}
			yield(worker.Failed("the agent is unreachable: "+err.Error(), true, agentwire.CodeAgentUnavailable))
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			text := fmt.Sprintf("the agent answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
			if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
				yield(worker.Failed(text, true, agentwire.CodeAgentUnavailable))
			} else {
				yield(worker.Failed(text, false, agentwire.CodeAgentRejected))
			}
			return
		}
		stopped := false
		_, err = agentwire.Read(resp.Body, agentwire.FormatOf(resp.Header.Get("Content-Type")), func(ev worker.Event) bool {
			if !yield(ev) {
				stopped = true
				return false
			}
			return true
		})
		switch {
		case stopped, ctx.Err() != nil:
		case errors.Is(err, agentwire.ErrProtocol):
			yield(agentwire.ProtocolFailure(err))
		case err != nil:
			yield(worker.Failed("reading the agent's stream: "+err.Error(), true, agentwire.CodeAgentUnavailable))
		}
	}
}
