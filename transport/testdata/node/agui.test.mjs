// @ag-ui/client's HttpAgent against POST /ag-ui/echo: two runs on one
// thread, every event validated by the library (schemas and verifyEvents),
// and no [ag-ui] warning.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HttpAgent } from '@ag-ui/client';
import { base, unique, words } from './lib.mjs';

test('two runs on one thread', async () => {
  const warnings = [];
  const warn = console.warn;
  console.warn = (...a) => { warnings.push(a.join(' ')); warn(...a); };
  try {
    const agent = new HttpAgent({ url: `${base}/ag-ui/echo`, threadId: unique('thread') });
    const seen = [];
    const subscriber = { onEvent: ({ event }) => { seen.push(event.type); } };
    for (const text of [words('first', 6), words('second', 4)]) {
      agent.addMessage({ id: unique('u'), role: 'user', content: text });
      const before = seen.length;
      const res = await agent.runAgent({ runId: unique('run') }, subscriber);
      const last = agent.messages.at(-1);
      assert.equal(last.role, 'assistant');
      assert.equal(last.content, text);
      assert.ok(res.newMessages.some((m) => m.role === 'assistant' && m.content === text));
      const types = seen.slice(before);
      assert.equal(types[0], 'RUN_STARTED');
      assert.equal(types.at(-1), 'RUN_FINISHED');
      assert.ok(types.includes('TEXT_MESSAGE_CONTENT'));
    }
    assert.equal(agent.messages.filter((m) => m.role === 'assistant').length, 2);
  } finally {
    console.warn = warn;
  }
  assert.deepEqual(warnings.filter((w) => w.includes('[ag-ui]')), []);
});
