// The golden byte streams of transport/testdata (a turn with reasoning,
// text, a tool call and its result, and a failure) served as they are to
// each library's own client: what the unit tests fix byte for byte, the
// libraries must accept and turn into the right messages, with no warning.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import { AbstractChat, DefaultChatTransport } from 'ai';
import { HttpAgent } from '@ag-ui/client';
import { ClientFactory } from '@a2a-js/sdk/client';

const golden = (name) => readFileSync(new URL(`../${name}`, import.meta.url), 'utf8');

let server;
let url;
before(async () => {
  server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      const name = req.url.slice(1);
      let out = golden(name);
      if (name.startsWith('a2a_stream')) {
        // The stream answers the request's JSON-RPC id.
        out = out.replaceAll('"id":"s1"', `"id":${JSON.stringify(JSON.parse(body).id)}`);
      }
      const headers = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };
      if (name.startsWith('aisdk')) headers['x-vercel-ai-ui-message-stream'] = 'v1';
      res.writeHead(200, headers);
      res.end(out);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  url = `http://127.0.0.1:${server.address().port}`;
});
after(() => server.close());

function captureWarnings() {
  const warnings = [];
  const warn = console.warn;
  console.warn = (...a) => { warnings.push(a.join(' ')); };
  return () => { console.warn = warn; return warnings; };
}

class State {
  constructor() { this.messages = []; this.status = 'ready'; this.error = undefined; }
  pushMessage(m) { this.messages = this.messages.concat(m); }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = [...this.messages.slice(0, i), structuredClone(m), ...this.messages.slice(i + 1)]; }
  snapshot(x) { return structuredClone(x); }
}
const chatOn = (name) => new (class extends AbstractChat {})({
  id: 'golden', state: new State(), transport: new DefaultChatTransport({ api: `${url}/${name}` }),
});

test('ai sdk: every kind of chunk becomes the right parts', async () => {
  const chat = chatOn('aisdk_completed.txt');
  await chat.sendMessage({ text: 'hi' });
  assert.equal(chat.error, undefined);
  const m = chat.messages.at(-1);
  assert.equal(m.role, 'assistant');
  assert.equal(m.metadata.submissionId, 'sub_1');
  const parts = m.parts.filter((p) => p.type !== 'step-start');
  assert.deepEqual(parts.map((p) => p.type), ['reasoning', 'text', 'tool-lookup', 'text']);
  assert.equal(parts[0].text, 'Let me think.');
  assert.equal(parts[1].text, 'Hello');
  assert.equal(parts[2].state, 'output-available');
  assert.deepEqual(parts[2].input, { q: 'x' });
  assert.deepEqual(parts[2].output, { answer: 42 });
  assert.equal(parts[3].text, ', world!');
});

test('ai sdk: a failed turn is an error', async () => {
  const chat = chatOn('aisdk_failed.txt');
  await chat.sendMessage({ text: 'hi' });
  assert.equal(chat.status, 'error');
  assert.match(chat.error.message, /agent_failed: the model went away/);
});

test('ag-ui: every kind of event passes validation and becomes the right messages', async () => {
  const done = captureWarnings();
  const agent = new HttpAgent({ url: `${url}/agui_completed.txt`, threadId: 'thread1' });
  agent.addMessage({ id: 'u1', role: 'user', content: 'hi' });
  await agent.runAgent({ runId: 'run1' });
  assert.deepEqual(done().filter((w) => w.includes('[ag-ui]')), []);
  const roles = agent.messages.map((m) => m.role);
  assert.deepEqual(roles, ['user', 'reasoning', 'assistant', 'tool', 'assistant']);
  const [, reasoning, first, tool, last] = agent.messages;
  assert.equal(reasoning.content, 'Let me think.');
  assert.equal(first.content, 'Hello');
  assert.equal(first.toolCalls[0].function.name, 'lookup');
  assert.equal(first.toolCalls[0].function.arguments, '{"q":"x"}');
  assert.equal(tool.toolCallId, 'call_1');
  assert.equal(tool.content, '{"answer":42}');
  assert.equal(last.content, ', world!');
});

test('ag-ui: a failed turn is a RUN_ERROR', async () => {
  const done = captureWarnings();
  const errors = console.error;
  console.error = () => {};
  const agent = new HttpAgent({ url: `${url}/agui_failed.txt`, threadId: 'thread1' });
  agent.addMessage({ id: 'u1', role: 'user', content: 'hi' });
  let runError;
  try {
    await agent.runAgent({ runId: 'run1' }, { onRunErrorEvent: ({ event }) => { runError = event; } });
  } catch { /* the run rejects on RUN_ERROR */ } finally {
    console.error = errors;
  }
  assert.deepEqual(done().filter((w) => w.includes('[ag-ui]')), []);
  assert.equal(runError?.code, 'agent_failed');
  assert.equal(runError?.message, 'the model went away');
});

test('a2a: the stream parses into task, status and artifact updates', async () => {
  for (const [name, final, text] of [['a2a_stream_completed.txt', 3, 'Hello, world!'], ['a2a_stream_failed.txt', 4, 'Hello, world']]) {
    const card = JSON.parse(golden('a2a_card.json').replaceAll('http://HOST/a2a/echo', `${url}/${name}`));
    const client = await new ClientFactory().createFromAgentCard(card);
    const kinds = [];
    let streamed = '';
    let state;
    for await (const ev of client.sendMessageStream({ message: { messageId: 'm1', contextId: 'ctx1', taskId: '', role: 1, parts: [{ content: { $case: 'text', value: 'hi' }, filename: '', mediaType: '' }], extensions: [], referenceTaskIds: [] } })) {
      kinds.push(ev.payload.$case);
      if (ev.payload.$case === 'artifactUpdate') streamed += ev.payload.value.artifact.parts.map((p) => p.content.value).join('');
      if (ev.payload.$case === 'statusUpdate') state = ev.payload.value.status.state;
    }
    assert.equal(kinds[0], 'task');
    assert.equal(streamed, text);
    assert.equal(state, final);
  }
});
