// Helpers shared by the client-library tests. The Go test TestNodeClients
// starts `convlog serve` and passes its URL in CONVLOG_URL.
import { AbstractChat, DefaultChatTransport } from 'ai';
import { readFileSync, writeFileSync } from 'node:fs';

export const base = process.env.CONVLOG_URL;
if (!base) throw new Error('CONVLOG_URL is not set: run these through the Go test TestNodeClients');

// A plain ChatState: what @ai-sdk/react's Chat keeps in React state.
class PlainState {
  constructor(messages = []) {
    this.messages = messages;
    this.status = 'ready';
    this.error = undefined;
  }
  pushMessage(m) { this.messages = this.messages.concat(m); }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = [...this.messages.slice(0, i), this.snapshot(m), ...this.messages.slice(i + 1)]; }
  snapshot(x) { return structuredClone(x); }
}

// NodeChat is useChat without React: AbstractChat is what its Chat extends.
export class NodeChat extends AbstractChat {
  constructor({ messages, agent = 'echo', ...init }) {
    super({ ...init, state: new PlainState(messages), transport: new DefaultChatTransport({ api: `${base}/ai-sdk/${agent}` }) });
  }
}

// answer is the text of the chat's last assistant message.
export function answer(chat) {
  const last = chat.messages.at(-1);
  if (!last || last.role !== 'assistant') return '';
  return last.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
}

export async function until(what, cond, ms = 20000) {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

// words makes an echo prompt of n words (the echo agent streams it back
// word by word, --echo-delay apart).
export function words(tag, n) {
  return Array.from({ length: n }, (_, i) => `${tag}${i}`).join(' ');
}

export const unique = (p) => `${p}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;

// State handed from a script run before a kill -9 to the one after.
const stateFile = process.env.CONVLOG_STATE;
export const saveState = (s) => writeFileSync(stateFile, JSON.stringify(s));
export const loadState = () => JSON.parse(readFileSync(stateFile, 'utf8'));

// A2A parts and messages in the SDK's own (protobuf-derived) shapes.
export const textPart = (value) => ({ content: { $case: 'text', value }, metadata: undefined, filename: '', mediaType: 'text/plain' });
export const userMessage = (text, contextId = '') => ({
  messageId: unique('msg'), contextId, taskId: '', role: 1 /* ROLE_USER */, parts: [textPart(text)],
  metadata: undefined, extensions: [], referenceTaskIds: [],
});
export const artifactText = (task) => (task.artifacts ?? []).flatMap((a) => a.parts).map((p) => p.content?.value ?? '').join('');
