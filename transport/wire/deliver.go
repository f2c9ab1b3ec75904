package wire

import (
	"encoding/json"
	"net/url"

	"github.com/convlog/convlog/log/record"
)

// DeliverRequest is the body of POST /agents/:name/:instanceId, as the
// client sends it. On the wire "message" may also be a bare string, short
// for {"kind":"user","body":"..."}.
type DeliverRequest struct {
	Message Message `json:"message"`
	// Session defaults to "default".
	Session string `json:"session,omitempty"`
	// InitialData (any JSON) and UID (a string of at most 128 printable
	// characters) are stored in the user entry's metadata under the keys
	// "initialData" and "uid", for the worker that creates the instance or
	// pins its generation.
	InitialData json.RawMessage `json:"initialData,omitempty"`
	UID         string          `json:"uid,omitempty"`
}

// Message is a delivered user message: a body (text) and/or parts.
type Message struct {
	Kind     string          `json:"kind"` // "user"
	Body     string          `json:"body,omitempty"`
	Parts    []record.Part   `json:"parts,omitempty"`
	Purpose  string          `json:"purpose,omitempty"` // user (default), dispatch or advisory
	Display  string          `json:"display,omitempty"` // visible (default), hidden or diagnostic
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// Accepted is the 202 body of a delivery. Offset is the stream position
// before the delivery: reading from it returns the user message first and
// then everything the agent does about it.
type Accepted struct {
	SubmissionID    string        `json:"submissionId"`
	StreamURL       string        `json:"streamUrl"`
	ConversationURL string        `json:"conversationUrl"`
	UpdatesURL      string        `json:"updatesUrl"`
	Offset          record.Offset `json:"offset"`
	// UID is the instance generation the delivery went to.
	UID string `json:"uid,omitempty"`
}

// InstancePath is the path of an agent instance, under which every route
// of a conversation lives.
func InstancePath(agent, instance string) string {
	return "/agents/" + url.PathEscape(agent) + "/" + url.PathEscape(instance)
}
