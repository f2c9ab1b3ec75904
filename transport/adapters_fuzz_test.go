package transport

import (
	"encoding/json"
	"testing"
)

// The adapters' decoders take any bytes without panicking, and what they
// accept is a payload the log can store.
func FuzzAdapterDecoders(f *testing.F) {
	f.Add([]byte(`{"id":"c","trigger":"submit-message","messages":[{"id":"m","role":"user","parts":[{"type":"text","text":"x"},{"type":"file","mediaType":"image/png","url":"data:image/png;base64,AA=="}]}]}`))
	f.Add([]byte(`{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user","content":[{"type":"text","text":"x"},{"type":"binary","mimeType":"image/png","data":"AA=="}]}]}`))
	f.Add([]byte(`{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"x"},{"raw":"AA==","mediaType":"image/png"},{"data":{"a":1}}]}}`))
	f.Add([]byte(`{"messages":[{"role":"user","parts":null}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(p []byte) {
			if !json.Valid(p) {
				t.Fatalf("payload not JSON: %s", p)
			}
		}
		if _, _, p, err := decodeAIChat(body); err == nil {
			b, _ := json.Marshal(p)
			check(b)
		}
		if _, _, p, err := decodeAGUI(body); err == nil {
			b, _ := json.Marshal(p)
			check(b)
		}
	})
}
