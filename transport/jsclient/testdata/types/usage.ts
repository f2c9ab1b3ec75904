// Compiles against the client's declarations the way an application uses
// them; tsc --strict fails on any declaration that is wrong or incomplete.
import { Client, ConvlogError, Follower, project, Projector, DEFAULT_IDLE_TIMEOUT_MS } from "../../convlog.js";
import type { Accepted, DoneResult, FollowerEvent, Message, Part, Settlement, View } from "../../convlog.js";

async function main(): Promise<void> {
  const client = new Client({ baseUrl: "http://127.0.0.1:8080", headers: { "X-Demo": "1" } });
  const accepted: Accepted = await client.send("echo", "demo", { kind: "user", body: "hi", parts: [{ type: "data", data: { n: 1 } }] }, { session: "s", idempotencyKey: "k" });
  const offset: string = accepted.offset;
  const f: Follower = client.follow("echo", "demo", { offset, live: "auto", idleTimeoutMs: DEFAULT_IDLE_TIMEOUT_MS, until: accepted.submissionId });
  const off = f.subscribe((ev: FollowerEvent) => {
    switch (ev.type) {
      case "records":
        console.log(ev.records.length, ev.offset);
        break;
      case "delta":
        console.log(ev.preview.parts.length);
        break;
      case "reset":
        console.log(ev.incarnation);
        break;
      case "done":
        console.log(ev.reason);
        break;
    }
  });
  await f.waitFor((x) => x.view.settlements.length > 0);
  const done: DoneResult = await f.done;
  if (done.reason === "settled") {
    const s: Settlement = done.settlement;
    console.log(s.outcome, s.error?.code);
  } else if (done.reason === "terminal") {
    console.log(done.submission.status);
  } else if (done.reason === "error") {
    const e: ConvlogError = done.error;
    console.log(e.code, e.status);
  }
  off();
  f.close();
  const { follower } = await client.sendAndFollow("echo", "demo", "hello", { live: "poll" });
  follower.close();
  const page = await client.page("echo", "demo", { offset: "0", limit: 10 });
  const view: View = project(page.batches.flatMap((b) => b.records));
  const p = new Projector();
  p.apply(...page.batches.flatMap((b) => b.records));
  const m: Message | undefined = p.view().messages[0];
  const parts: Part[] = m?.parts ?? [];
  for (const part of parts) {
    if (part.type === "tool") console.log(part.toolName, part.state, part.errorText);
    if (part.type === "text") console.log(part.text.length);
  }
  const sub = await client.submission("echo", "demo", accepted.submissionId, { wait: "30s" });
  console.log(sub.status, view.messages.length);
  await client.abort("echo", "demo", accepted.submissionId);
}

void main;
