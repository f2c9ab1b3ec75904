package wire

// Frame types of the SSE stream's data. Conversation frames are durable
// and carry an id (the offset to resume from); everything else the
// DeltaSource sends is presentation-only and carries none.
const (
	FrameConversation = "conversation"
	FrameError        = "error"
)
