// @a2a-js/sdk's client (ClientFactory from the agent card) against
// /a2a/echo: card, send, stream, get, list, cancel, subscribe.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ClientFactory } from '@a2a-js/sdk/client';
import { base, userMessage, artifactText, words, unique } from './lib.mjs';

const COMPLETED = 3, CANCELED = 5;

async function client() {
  // The card URL is relative to the base, so the base ends with a slash.
  return new ClientFactory().createFromUrl(`${base}/a2a/echo/`);
}

test('card, at the agent and as the default', async () => {
  const c = await client();
  const card = await c.getAgentCard();
  assert.equal(card.name, 'echo');
  assert.equal(card.supportedInterfaces[0].url, `${base}/a2a/echo`);
  assert.equal(card.capabilities.streaming, true);
  const d = await new ClientFactory().createFromUrl(base);
  assert.equal((await d.getAgentCard()).name, 'echo');
});

test('send (blocking), get, list', async () => {
  const c = await client();
  const contextId = unique('ctx');
  const text = words('a', 5);
  const task = await c.sendMessage({ message: userMessage(text, contextId) });
  assert.equal(task.status.state, COMPLETED);
  assert.equal(task.contextId, contextId);
  assert.equal(artifactText(task), text);
  const got = await c.getTask({ id: task.id });
  assert.equal(got.status.state, COMPLETED);
  assert.equal(artifactText(got), text);
  const list = await c.listTasks({ contextId, includeArtifacts: true });
  assert.deepEqual(list.tasks.map((t) => t.id), [task.id]);
});

test('stream: task, working, the artifact in chunks, completed', async () => {
  const c = await client();
  const text = words('s', 8);
  const kinds = [];
  let streamed = '';
  let last;
  for await (const ev of c.sendMessageStream({ message: userMessage(text) })) {
    kinds.push(ev.payload.$case);
    if (ev.payload.$case === 'artifactUpdate') {
      streamed += ev.payload.value.artifact.parts.map((p) => p.content.value).join('');
    }
    if (ev.payload.$case === 'statusUpdate') last = ev.payload.value.status.state;
  }
  assert.equal(kinds[0], 'task');
  assert.equal(streamed, text);
  assert.equal(last, COMPLETED);
});

test('cancel a queued task; subscribe replays a task from the log', async () => {
  const c = await client();
  const contextId = unique('ctx');
  const long = await c.sendMessage({ message: userMessage(words('l', 40), contextId), configuration: { returnImmediately: true } });
  const queued = await c.sendMessage({ message: userMessage('never runs', contextId), configuration: { returnImmediately: true } });
  const canceled = await c.cancelTask({ id: queued.id });
  assert.equal(canceled.status.state, CANCELED);
  let text = '';
  let state;
  for await (const ev of c.resubscribeTask({ id: long.id })) {
    if (ev.payload.$case === 'artifactUpdate') text += ev.payload.value.artifact.parts.map((p) => p.content.value).join('');
    if (ev.payload.$case === 'statusUpdate') state = ev.payload.value.status.state;
  }
  assert.equal(text, words('l', 40));
  assert.equal(state, COMPLETED);
});
