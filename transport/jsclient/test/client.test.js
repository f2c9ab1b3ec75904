// The JS client against a real convlog serve: delivery, SSE and polling,
// the fall back from SSE to polling, the idle reconnect, a server killed
// mid-answer, a truncation and an incarnation change.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import { Client, project, Projector } from "../convlog.js";
import { Serve, eventually, haveServer } from "./harness.js";

const skip = haveServer ? false : "CONVLOG_BIN is not set (run through go test ./transport/jsclient)";
const fast = { minRetryMs: 20, maxRetryMs: 200, pollIntervalMs: 50 };

let srv;
let client;
// Every follower of every test, closed at the end even after a failure, so
// that no retry loop keeps the process alive.
const followers = [];
const follow = Client.prototype.follow;
Client.prototype.follow = function (...args) {
  const f = follow.apply(this, args);
  followers.push(f);
  return f;
};
before(async () => {
  if (skip) return;
  srv = await Serve.start(["--echo-delay", "30ms"]);
  client = new Client({ baseUrl: srv.base });
});
after(async () => {
  for (const f of followers) f.close();
  await srv?.stop();
});

const texts = (view) => view.messages.map((m) => `${m.role}:${m.parts.filter((p) => p.type === "text").map((p) => p.text).join("")}`);

// fresh is the projection of a read of the whole stream from "0": what a
// follower must have ended with, whatever happened on the way.
async function fresh(agent, instance) {
  const records = [];
  let offset = "0";
  for (;;) {
    const page = await client.page(agent, instance, { offset });
    for (const b of page.batches) records.push(...b.records);
    offset = page.nextOffset;
    if (page.upToDate) return { view: project(records), incarnation: page.incarnation, offset };
  }
}

test("send, then follow over SSE with live deltas until the settlement", { skip }, async () => {
  const f = client.follow("echo", "sse-1", { ...fast, live: "sse" });
  let deltas = 0;
  f.subscribe((ev) => ev.type === "delta" && deltas++);
  const accepted = await client.send("echo", "sse-1", "one two three four five six seven eight");
  assert.match(accepted.submissionId, /^sub_/);
  assert.equal(accepted.offset, "0");
  await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === accepted.submissionId));
  assert.deepEqual(texts(f.view), ["user:one two three four five six seven eight", "assistant:one two three four five six seven eight"]);
  assert.equal(f.view.settlements[0].outcome, "completed");
  assert.ok(deltas > 0, "no delta frame was seen");
  assert.equal(f.previews.size, 0, "a preview outlived its turn's settlement");
  assert.equal(f.transport, "sse");
  assert.deepEqual(f.view, (await fresh("echo", "sse-1")).view);
  assert.equal(f.offset, (await fresh("echo", "sse-1")).offset);
  f.close();
  assert.equal((await f.done).reason, "closed");
});

test("sendAndFollow stops on its own settlement; the same key replays", { skip }, async () => {
  const { accepted, follower } = await client.sendAndFollow("echo", "until-1", "hello there", { ...fast, idempotencyKey: "k-1" });
  const done = await follower.done;
  assert.equal(done.reason, "settled");
  assert.equal(done.settlement.submissionId, accepted.submissionId);
  assert.equal(done.settlement.outcome, "completed");
  const again = await client.send("echo", "until-1", "hello there", { idempotencyKey: "k-1" });
  assert.equal(again.submissionId, accepted.submissionId);
  assert.equal(again.replayed, true);
  const status = await client.submission("echo", "until-1", accepted.submissionId);
  assert.equal(status.status, "completed");
});

test("sendAndFollow over polling from the 202's offset: no spurious reset", { skip }, async () => {
  await (await client.sendAndFollow("echo", "until-poll", "first", { ...fast, live: "poll" })).follower.done;
  const { accepted, follower } = await client.sendAndFollow("echo", "until-poll", "second", { ...fast, live: "poll" });
  assert.notEqual(accepted.offset, "0");
  const done = await follower.done;
  assert.equal(done.reason, "settled");
  assert.equal(follower.resets, 0);
  assert.deepEqual(texts(follower.view), ["user:second", "assistant:second"]);
});

test("live: poll reads JSON pages and gets the same view", { skip }, async () => {
  const f = client.follow("echo", "poll-1", { ...fast, live: "poll" });
  const a = await client.send("echo", "poll-1", "polled words here");
  await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === a.submissionId));
  assert.equal(f.transport, "poll");
  assert.equal(f.status, "polling");
  assert.deepEqual(f.view, (await fresh("echo", "poll-1")).view);
  f.close();
});

test("a client mistake stops the follower with the error", { skip }, async () => {
  const f = client.follow("nosuch", "x", fast);
  const done = await f.done;
  assert.equal(done.reason, "error");
  assert.equal(done.error.code, "not_found");
  assert.equal(done.error.status, 404);
  await assert.rejects(client.send("echo", "bad", "   "), (e) => e.code === "bad_request" && e.status === 400);
});

// A proxy in front of the server that breaks SSE the way some middleboxes
// do (an HTML error page for the stream) and passes everything else.
async function sseBreakingProxy() {
  const proxy = createServer((req, res) => {
    if (req.url.includes("/stream")) {
      res.writeHead(502, { "Content-Type": "text/html" });
      res.end("<html>bad gateway</html>");
      return;
    }
    const up = request(`${srv.base}${req.url}`, { method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise((r) => proxy.listen(0, "127.0.0.1", r));
  return { proxy, base: `http://127.0.0.1:${proxy.address().port}` };
}

test("live: auto falls back to polling when SSE fails; live: sse does not", { skip }, async () => {
  const { proxy, base } = await sseBreakingProxy();
  try {
    const c = new Client({ baseUrl: base });
    const auto = c.follow("echo", "fallback-1", { ...fast, live: "auto" });
    const strict = c.follow("echo", "fallback-1", { ...fast, live: "sse" });
    const a = await c.send("echo", "fallback-1", "through the proxy");
    await auto.waitFor((f) => f.view.settlements.some((s) => s.submissionId === a.submissionId));
    assert.equal(auto.transport, "poll");
    assert.deepEqual(texts(auto.view), ["user:through the proxy", "assistant:through the proxy"]);
    await strict.waitFor((f) => f.reconnects >= 2);
    assert.equal(strict.transport, "sse");
    assert.equal(strict.view.messages.length, 0);
    auto.close();
    strict.close();
  } finally {
    proxy.closeAllConnections();
    await new Promise((r) => proxy.close(r));
  }
});

test("reconnects after idleTimeoutMs of transport silence", { skip }, async () => {
  // No keepalives for an hour: the only bytes are frames.
  const quiet = await Serve.start(["--heartbeat", "1h", "--echo-delay", "1ms"]);
  try {
    const c = new Client({ baseUrl: quiet.base });
    const f = c.follow("echo", "idle-1", { ...fast, live: "sse", idleTimeoutMs: 300 });
    const reasons = [];
    f.subscribe((ev) => ev.type === "connect" && reasons.push(ev.reason));
    await f.waitFor(() => reasons.filter((r) => r === "idle").length >= 2);
    assert.equal(f.transport, "sse", "an idle stream that did connect is not a broken SSE");
    const a = await c.send("echo", "idle-1", "still here");
    await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === a.submissionId));
    f.close();
  } finally {
    await quiet.stop();
  }
});

for (const signal of ["SIGKILL", "SIGTERM"]) test(`a server stopped (${signal}) mid-answer and restarted: the follower resumes, nothing lost or repeated`, { skip }, async () => {
  const slow = await Serve.start(["--echo-delay", "150ms"]);
  try {
    const c = new Client({ baseUrl: slow.base });
    const first = await c.send("echo", "restart-1", "warm up");
    const f = c.follow("echo", "restart-1", { ...fast, live: "sse" });
    await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === first.submissionId));
    const words = Array.from({ length: 40 }, (_, i) => `w${i}`).join(" ");
    const a = await c.send("echo", "restart-1", words);
    await f.waitFor((f) => [...f.previews.values()].some((p) => p.parts.some((x) => x.text?.length > 0)));
    const statuses = [];
    f.subscribe((ev) => ev.type === "status" && statuses.push(ev.status));
    await slow.restart(signal);
    await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === a.submissionId) && f.status === "live");
    assert.ok(statuses.includes("reconnecting"), `statuses ${statuses}`);
    assert.ok(f.reconnects >= 1);
    const s = f.view.settlements.find((s) => s.submissionId === a.submissionId);
    if (signal === "SIGKILL") {
      // kill -9 cut the turn short: recovery settles it, it never re-runs.
      assert.equal(s.outcome, "failed");
      assert.equal(s.error.code, "interrupted");
    } else {
      // A graceful stop lets the running turn finish (--shutdown-timeout).
      assert.equal(s.outcome, "completed");
      assert.equal(texts(f.view).at(-1), `assistant:${words}`);
    }
    const ids = f.view.messages.map((m) => m.id);
    assert.equal(new Set(ids).size, ids.length, "a message was repeated");
    assert.equal(f.view.messages.filter((m) => m.role === "user").length, 2);
    const c2 = new Client({ baseUrl: slow.base });
    const truth = { view: null };
    const records = [];
    for (let offset = "0"; ; ) {
      const page = await c2.page("echo", "restart-1", { offset });
      for (const b of page.batches) records.push(...b.records);
      offset = page.nextOffset;
      if (page.upToDate) break;
    }
    truth.view = project(records);
    assert.deepEqual(f.view, truth.view);
    f.close();
  } finally {
    await slow.stop();
  }
});

test("a truncated record rewinds the follower's view", { skip }, async () => {
  const c = client;
  const f = c.follow("echo", "rewind-1", { ...fast, live: "sse" });
  const a = await c.send("echo", "rewind-1", "first question");
  await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === a.submissionId));
  const userId = f.view.messages[0].id;
  await srv.rewind("echo", "rewind-1", "default", userId);
  await f.waitFor((f) => f.view.messages.length === 1);
  assert.deepEqual(texts(f.view), ["user:first question"]);
  assert.equal(f.view.settlements.length, 1, "a truncation never removes a settlement");
  const b = await c.send("echo", "rewind-1", "second question");
  await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === b.submissionId));
  assert.deepEqual(texts(f.view), ["user:first question", "user:second question", "assistant:second question"]);
  assert.deepEqual(f.view, (await fresh("echo", "rewind-1")).view);
  f.close();
});

for (const live of ["sse", "poll"]) {
  test(`an incarnation change (${live}): discard everything, re-read from "0"`, { skip }, async () => {
    const inst = `reset-${live}`;
    const f = client.follow("echo", inst, { ...fast, live });
    const a = await client.send("echo", inst, "before the reset");
    await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === a.submissionId));
    const old = f.incarnation;
    assert.match(old, /^inc_/);
    const resets = [];
    f.subscribe((ev) => ev.type === "reset" && resets.push(ev.reason));
    const inc = await srv.resetStream("echo", inst);
    await f.waitFor((f) => f.resets >= 1);
    const b = await client.send("echo", inst, "after the reset");
    await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === b.submissionId));
    assert.notEqual(f.incarnation, old);
    assert.equal(f.incarnation, inc);
    assert.deepEqual(texts(f.view), ["user:after the reset", "assistant:after the reset"]);
    assert.ok(!f.view.settlements.some((s) => s.submissionId === a.submissionId), "old incarnation state survived");
    assert.deepEqual(f.view, (await fresh("echo", inst)).view);
    assert.ok(resets.length >= 1);
    f.close();
  });
}

test("following a submission settled before a reset ends on its terminal status", { skip }, async () => {
  const inst = "until-reset";
  const { accepted, follower } = await client.sendAndFollow("echo", inst, "settles first", fast);
  await follower.done;
  const tail = (await fresh("echo", inst)).offset;
  // Waiting for a settlement already behind the offset: only the reset can
  // end this, through the status route.
  const f = client.follow("echo", inst, { ...fast, offset: tail, until: accepted.submissionId });
  await f.waitFor((f) => f.status === "live");
  await srv.resetStream("echo", inst);
  const done = await f.done;
  assert.equal(done.reason, "terminal");
  assert.equal(done.submission.status, "completed");
});

// No convlog setting makes a reader too slow on demand (it takes a page of
// records landing while the reader is live), so a scripted SSE server plays
// that part of the protocol: the frame, then the resume it asks for.
test("reader_too_slow: the follower resumes from the frame's offset", async () => {
  const entry = (id, parentId, text) => ({ kind: "entry", entry: { id, parentId, timestamp: "2026-01-01T00:00:00Z", type: "user_message", payload: { parts: [{ type: "text", text }] } } });
  const seen = [];
  const sse = createServer((req, res) => {
    const u = new URL(req.url, "http://x");
    seen.push({ offset: u.searchParams.get("offset"), lastEventId: req.headers["last-event-id"] ?? null });
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.write(": connected\n\n");
    const frame = (o, n, rec) => `id: ${n}\ndata: ${JSON.stringify({ type: "conversation", incarnation: "inc_1", offset: o, nextOffset: n, records: [rec] })}\n\n`;
    if (seen.length === 1) {
      res.write(frame("0", "1", entry("a", "", "one")));
      res.end(`data: ${JSON.stringify({ type: "error", code: "reader_too_slow", message: "behind", offset: "1" })}\n\n`);
    } else {
      res.write(frame("1", "2", entry("b", "a", "two")));
    }
  });
  await new Promise((r) => sse.listen(0, "127.0.0.1", r));
  try {
    const c = new Client({ baseUrl: `http://127.0.0.1:${sse.address().port}` });
    const f = c.follow("echo", "slow", { ...fast, live: "sse" });
    const reasons = [];
    f.subscribe((ev) => ev.type === "connect" && reasons.push(ev.reason));
    await f.waitFor((f) => f.view.messages.length === 2);
    assert.deepEqual(reasons, ["reader_too_slow"]);
    assert.deepEqual(seen, [{ offset: "0", lastEventId: null }, { offset: "1", lastEventId: "1" }]);
    assert.equal(f.offset, "2");
    f.close();
  } finally {
    sse.closeAllConnections();
    await new Promise((r) => sse.close(r));
  }
});

// The reset and ended frames of servers whose reset and delete routes tell
// live readers (scripted here: this server has neither route).
test("reset and ended frames: discard everything, read again from \"0\"", async () => {
  const entry = (id, text) => ({ kind: "entry", entry: { id, parentId: "", timestamp: "2026-01-01T00:00:00Z", type: "user_message", payload: { parts: [{ type: "text", text }] } } });
  const frame = (inc, o, n, rec) => `id: ${n}\ndata: ${JSON.stringify({ type: "conversation", incarnation: inc, offset: n, nextOffset: n, batchOffset: o, records: [rec] })}\n\n`;
  const seen = [];
  const sse = createServer((req, res) => {
    seen.push({ offset: new URL(req.url, "http://x").searchParams.get("offset"), lastEventId: req.headers["last-event-id"] ?? null });
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    res.write(": connected\n\n");
    if (seen.length === 1) {
      res.write(frame("inc_1", "0", "1", entry("a", "old")));
      res.end(`data: ${JSON.stringify({ type: "reset", incarnation: "inc_2", previousIncarnation: "inc_1", offset: "0" })}\n\n`);
    } else if (seen.length === 2) {
      res.write(frame("inc_2", "0", "1", entry("b", "new")));
      res.end(`data: ${JSON.stringify({ type: "ended", reason: "deleted", incarnation: "inc_2", message: "deleted" })}\n\n`);
    }
    // Later: an absent conversation, open and silent.
  });
  await new Promise((r) => sse.listen(0, "127.0.0.1", r));
  try {
    const c = new Client({ baseUrl: `http://127.0.0.1:${sse.address().port}` });
    const f = c.follow("echo", "gone", { ...fast, live: "sse" });
    const views = [];
    f.subscribe((ev) => ev.type === "records" && views.push(texts(f.view)));
    const resets = [];
    f.subscribe((ev) => ev.type === "reset" && resets.push(ev.reason));
    await f.waitFor(() => seen.length === 3);
    await f.waitFor((f) => f.status === "live");
    assert.deepEqual(views, [["user:old"], ["user:new"]]);
    assert.deepEqual(resets, ["reset", "ended"]);
    assert.deepEqual(seen, [{ offset: "0", lastEventId: null }, { offset: "0", lastEventId: null }, { offset: "0", lastEventId: null }]);
    assert.deepEqual(f.view, { messages: [], settlements: [] });
    assert.equal(f.incarnation, null);
    f.close();
  } finally {
    sse.closeAllConnections();
    await new Promise((r) => sse.close(r));
  }
});

test("catching up does not copy the view per batch", { skip }, async () => {
  for (let i = 0; i < 5; i++) await (await client.sendAndFollow("echo", "catchup-1", `m${i}`, fast)).follower.done;
  const tail = (await fresh("echo", "catchup-1")).offset;
  const view = Projector.prototype.view;
  let copies = 0;
  Projector.prototype.view = function () {
    copies++;
    return view.call(this);
  };
  try {
    let batches = 0;
    const f = client.follow("echo", "catchup-1", { ...fast, live: "sse" });
    f.subscribe((ev) => ev.type === "records" && batches++);
    await new Promise((resolve) => f.subscribe(() => f.offset === tail && resolve()));
    assert.equal(batches, 10);
    assert.equal(copies, 0, "the view was copied before anyone asked for it");
    assert.equal(f.view.messages.length, 10);
    assert.equal(f.view, f.view, "asking twice copies once");
    assert.equal(copies, 1);
    f.close();
  } finally {
    Projector.prototype.view = view;
  }
});

const call = async (method, path, body) => {
  const res = await fetch(`${srv.base}${path}`, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${await res.clone().text()}`);
  return res.json();
};

for (const live of ["sse", "poll"]) {
  test(`POST …/reset mid-answer (${live}): the follower re-reads, its submission ends aborted`, { skip }, async () => {
    const slow = await Serve.start(["--echo-delay", "100ms"]);
    try {
      const c = new Client({ baseUrl: slow.base });
      const words = Array.from({ length: 50 }, (_, i) => `r${i}`).join(" ");
      const { accepted, follower } = await c.sendAndFollow("echo", `http-reset-${live}`, words, { ...fast, live });
      const watcher = c.follow("echo", `http-reset-${live}`, { ...fast, live });
      await eventually(async () => (await c.submission("echo", `http-reset-${live}`, accepted.submissionId)).status === "running");
      await watcher.waitFor((f) => f.incarnation !== null);
      const old = watcher.incarnation;
      const res = await fetch(`${slow.base}/agents/echo/http-reset-${live}/reset`, { method: "POST" });
      assert.equal(res.status, 200, await res.text());
      const done = await follower.done;
      // Settled in the new incarnation, where the follower read it after
      // discarding the old one.
      assert.ok(done.reason === "settled" || done.reason === "terminal", JSON.stringify(done));
      const outcome = done.settlement?.outcome ?? done.submission.status;
      assert.equal(outcome, "aborted");
      await watcher.waitFor((f) => f.resets >= 1 && f.view.settlements.some((s) => s.submissionId === accepted.submissionId));
      assert.notEqual(watcher.incarnation, old);
      assert.deepEqual(watcher.view.messages, [], "messages of the old incarnation survived");
      assert.equal(watcher.view.settlements[0].error.code, "stream_reset");
      watcher.close();
    } finally {
      await slow.stop();
    }
  });
}

test("rewind over HTTP: the truncated record reaches a connected follower", { skip }, async () => {
  const f = client.follow("echo", "http-rewind", { ...fast, live: "sse" });
  for (const m of ["first", "second"]) await (await client.sendAndFollow("echo", "http-rewind", m, fast)).follower.done;
  await f.waitFor((f) => f.view.messages.length === 4);
  const second = f.view.messages[2];
  await call("POST", "/agents/echo/http-rewind/rewind", { entryId: second.id });
  await f.waitFor((f) => f.view.messages.length === 2);
  assert.deepEqual(texts(f.view), ["user:first", "assistant:first"]);
  assert.deepEqual(f.view, (await fresh("echo", "http-rewind")).view);
  f.close();
});

test("DELETE of the instance: the follower empties its view and reads the next generation", { skip }, async () => {
  const f = client.follow("echo", "http-delete", { ...fast, live: "sse" });
  await (await client.sendAndFollow("echo", "http-delete", "before", fast)).follower.done;
  await f.waitFor((f) => f.view.messages.length === 2);
  await call("DELETE", "/agents/echo/http-delete");
  await f.waitFor((f) => f.view.messages.length === 0);
  const a = await client.send("echo", "http-delete", "after");
  await f.waitFor((f) => f.view.settlements.some((s) => s.submissionId === a.submissionId));
  assert.deepEqual(texts(f.view), ["user:after", "assistant:after"]);
  f.close();
});
