// The AI SDK's own chat (AbstractChat, what useChat drives) against
// POST /ai-sdk/echo and its resume route.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { NodeChat, answer, until, words, unique, base } from './lib.mjs';

test('send: the whole answer, with the submission id in the metadata', async () => {
  const chat = new NodeChat({ id: unique('chat') });
  const text = words('w', 5);
  await chat.sendMessage({ text });
  assert.equal(chat.status, 'ready');
  assert.equal(chat.error, undefined);
  assert.equal(answer(chat), text);
  assert.match(chat.messages.at(-1).metadata.submissionId, /^sub_/);
});

test('cut off after the first text, a new chat with the same id resumes and gets the whole answer once; idle resume is 204', async () => {
  const id = unique('chat');
  const text = words('long', 40);
  const chat = new NodeChat({ id });
  const sent = chat.sendMessage({ text });
  await until('the first text', () => answer(chat).length > 0);
  await chat.stop(); // the connection is cut mid-answer
  await sent;
  const partial = answer(chat);
  assert.ok(partial.length < text.length, `the answer ended before the cut (${partial.length} chars)`);

  // A reload: the page has the user message (from its storage) and resumes.
  const resumed = new NodeChat({ id, messages: [chat.messages[0]] });
  await resumed.resumeStream();
  assert.equal(resumed.error, undefined);
  assert.equal(resumed.messages.length, 2);
  assert.equal(answer(resumed), text);

  // Nothing runs any more: 204, the chat is unchanged.
  const again = new NodeChat({ id, messages: resumed.messages });
  await again.resumeStream();
  assert.equal(again.status, 'ready');
  assert.equal(again.messages.length, 2);
});

test('regenerate: the chat rewinds and the answer comes again', async () => {
  const chat = new NodeChat({ id: unique('chat') });
  await chat.sendMessage({ text: 'one two' });
  const firstId = chat.messages.at(-1).id;
  await chat.regenerate();
  assert.equal(chat.error, undefined);
  assert.equal(chat.messages.length, 2);
  assert.equal(answer(chat), 'one two');
  assert.notEqual(chat.messages.at(-1).id, firstId);
  const conv = await (await fetch(`${base}/agents/echo/${chat.id}/conversation`)).json();
  assert.ok(conv.batches.flatMap((b) => b.records).some((r) => r.kind === 'truncated'));
});
