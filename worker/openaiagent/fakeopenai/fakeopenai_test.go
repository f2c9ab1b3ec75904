package fakeopenai_test

import (
	"context"
	"errors"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"

	"github.com/convlog/convlog/worker/openaiagent/fakeopenai"
)

// The fake is checked against the official SDK's own parser and
// accumulator: what it streams must come out of them as meant.
func TestSDKParsesTheFake(t *testing.T) {
	srv := fakeopenai.New(fakeopenai.Response{Chunks: []fakeopenai.Chunk{
		{Reasoning: "thinking..."},
		{Content: "Hello"},
		{Content: ", world"},
		{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, ID: "call_a", Name: "get_weather", Arguments: `{"ci`}}},
		{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, Arguments: `ty":"Paris"}`}, {Index: 1, ID: "call_b", Name: "get_time", Arguments: `{}`}}},
	}})
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.BaseURL()), option.WithAPIKey("sk-fake"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "gpt-4o-mini",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	chunks, sawReasoning, sawUsage := 0, false, false
	for stream.Next() {
		c := stream.Current()
		chunks++
		if c.Object != "chat.completion.chunk" || c.ID == "" || c.Model != "gpt-4o-mini" {
			t.Fatalf("chunk %s", c.RawJSON())
		}
		if len(c.Choices) > 0 {
			if f, ok := c.Choices[0].Delta.JSON.ExtraFields["reasoning_content"]; ok && f.Raw() == `"thinking..."` {
				sawReasoning = true
			}
		} else if c.Usage.TotalTokens > 0 {
			sawUsage = true
		}
		if !acc.AddChunk(c) {
			t.Fatalf("the accumulator refused chunk %d: %s", chunks, c.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 {
		t.Fatalf("%+v", acc.ChatCompletion)
	}
	ch := acc.Choices[0]
	if ch.Message.Content != "Hello, world" || ch.FinishReason != "tool_calls" || !sawReasoning || !sawUsage {
		t.Fatalf("content %q finish %q reasoning %v usage %v", ch.Message.Content, ch.FinishReason, sawReasoning, sawUsage)
	}
	tcs := ch.Message.ToolCalls
	if len(tcs) != 2 || tcs[0].ID != "call_a" || tcs[0].Function.Name != "get_weather" || tcs[0].Function.Arguments != `{"city":"Paris"}` || tcs[1].Function.Name != "get_time" {
		t.Fatalf("tool calls %+v", tcs)
	}
	if acc.Usage.TotalTokens == 0 {
		t.Fatalf("usage %+v", acc.Usage)
	}
}

func TestSDKParsesTheErrors(t *testing.T) {
	for _, r := range []fakeopenai.Response{fakeopenai.ErrInvalidKey, fakeopenai.ErrUnknownModel, fakeopenai.ErrRateLimited, fakeopenai.ErrOverloaded} {
		srv := fakeopenai.New(r)
		client := openai.NewClient(option.WithBaseURL(srv.BaseURL()), option.WithAPIKey("sk-fake"), option.WithMaxRetries(0))
		stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		for stream.Next() {
		}
		var apiErr *openai.Error
		if !errors.As(stream.Err(), &apiErr) || apiErr.StatusCode != r.Status || apiErr.Message != r.Error.Message || apiErr.Type != r.Error.Type {
			t.Errorf("status %d: %v", r.Status, stream.Err())
		}
		srv.Close()
	}
}
