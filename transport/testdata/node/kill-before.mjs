// Before the kill -9: a long answer runs and a second message waits behind
// it, for the AI SDK and for A2A; a third A2A task has completed.
import assert from 'node:assert/strict';
import { ClientFactory } from '@a2a-js/sdk/client';
import { NodeChat, answer, until, words, unique, saveState, base, userMessage } from './lib.mjs';

const chatId = unique('chat');
const first = new NodeChat({ id: chatId });
first.sendMessage({ text: words('slow', 2000) }); // still running at the kill
await until('the first answer to start', () => answer(first).length > 0);
// A second tab sends the next message: admitted, queued behind the first.
const second = new NodeChat({ id: chatId, messages: first.messages.slice(0, 1) });
// Long enough to be still running when the client resumes after the restart.
const secondText = words('queued', 400);
second.sendMessage({ text: secondText });
// Admitted means in the log: the conversation shows it.
await until('the second message to be admitted', async () => {
  const conv = await (await fetch(`${base}/agents/echo/${chatId}/conversation`)).json();
  return conv.batches.flatMap((b) => b.records).filter((r) => r.entry?.type === 'user_message').length === 2;
});

const a2a = await new ClientFactory().createFromUrl(`${base}/a2a/echo/`);
const contextId = unique('ctx');
const doneText = words('done', 6);
const done = await a2a.sendMessage({ message: userMessage(doneText, contextId) });
const slow = await a2a.sendMessage({ message: userMessage(words('slowtask', 2000), contextId), configuration: { returnImmediately: true } });
const queuedText = words('waiting', 10);
const queued = await a2a.sendMessage({ message: userMessage(queuedText, contextId), configuration: { returnImmediately: true } });
assert.notEqual(queued.status.state, 3);

saveState({ chatId, userMessages: [first.messages[0], second.messages.find((m) => m.role === 'user' && m.id !== first.messages[0].id)], secondText, done: done.id, doneText, slow: slow.id, queued: queued.id, queuedText });
console.log('ready for the kill');
process.exit(0); // cuts every connection
