// After kill -9 and restart: the answers come from the log, whole, once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ClientFactory } from '@a2a-js/sdk/client';
import { NodeChat, answer, loadState, base, artifactText } from './lib.mjs';

const s = loadState();
const COMPLETED = 3, FAILED = 4;

test('ai sdk: the queued message is answered after the restart and resumes whole', async () => {
  const chat = new NodeChat({ id: s.chatId, messages: s.userMessages });
  await chat.resumeStream();
  assert.equal(chat.error, undefined);
  assert.equal(chat.messages.length, 3);
  assert.equal(answer(chat), s.secondText);
  const again = new NodeChat({ id: s.chatId, messages: chat.messages });
  await again.resumeStream(); // 204: nothing runs
  assert.equal(again.messages.length, 3);
});

test('a2a: tasks outlive the restart; subscribe replays them from the log', async () => {
  const c = await new ClientFactory().createFromUrl(`${base}/a2a/echo/`);
  for (const [id, want] of [[s.queued, s.queuedText], [s.done, s.doneText]]) {
    let text = '';
    let state;
    for await (const ev of c.resubscribeTask({ id })) {
      if (ev.payload.$case === 'artifactUpdate') text += ev.payload.value.artifact.parts.map((p) => p.content.value).join('');
      if (ev.payload.$case === 'statusUpdate') state = ev.payload.value.status.state;
    }
    assert.equal(text, want);
    assert.equal(state, COMPLETED);
    const t = await c.getTask({ id });
    assert.equal(artifactText(t), want);
  }
  // The task that was running when the server died is settled, not lost.
  const slow = await c.getTask({ id: s.slow });
  assert.ok([COMPLETED, FAILED].includes(slow.status.state), `state ${slow.status.state}`);
});
