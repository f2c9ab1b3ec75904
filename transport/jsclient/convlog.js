// convlog's JS client: deliver messages, then follow a conversation over SSE
// or JSON polling, with the streaming protocol's client checklist built in
// (docs/protocol.md section 8.1). ESM, no dependencies: it runs in browsers
// and in Node 18+ (fetch and web streams are all it needs).
//
// A follower keeps the conversation's projected view (projection.js, a port
// of the Go package), its incarnation and its opaque offset, and live
// previews of running turns built from deltas, which are never stored.

import { Projector } from "./projection.js";

export { Projector, project } from "./projection.js";

export const DEFAULT_IDLE_TIMEOUT_MS = 90_000;
const TERMINAL = new Set(["completed", "failed", "aborted"]);

/** An error answered by the server ({"error":{code,message}}) or a transport failure. */
export class ConvlogError extends Error {
  constructor(message, { status = 0, code = "", body = undefined, incarnation = undefined } = {}) {
    super(message);
    this.name = "ConvlogError";
    this.status = status;
    this.code = code;
    this.body = body;
    this.incarnation = incarnation;
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

function randomKey() {
  if (globalThis.crypto?.randomUUID) return globalThis.crypto.randomUUID();
  const b = new Uint8Array(16);
  globalThis.crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// apiError reads a non-2xx answer. A body that is not convlog's error shape
// (a proxy's HTML page, say) gives code "" so callers can tell the two apart.
async function apiError(res) {
  let body;
  const text = await res.text().catch(() => "");
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  const e = body?.error;
  if (e && typeof e.code === "string") {
    return new ConvlogError(e.message ?? e.code, { status: res.status, code: e.code, body, incarnation: e.incarnation });
  }
  return new ConvlogError(`HTTP ${res.status}`, { status: res.status, body: text });
}

export class Client {
  /**
   * @param {{baseUrl?: string, fetch?: typeof fetch, headers?: Record<string,string>}} [opts]
   */
  constructor({ baseUrl = "", fetch: f = globalThis.fetch.bind(globalThis), headers = {} } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.fetch = f;
    this.headers = headers;
  }

  url(agent, instance, suffix = "", query = {}) {
    let u = `${this.baseUrl}/agents/${encodeURIComponent(agent)}/${encodeURIComponent(instance)}${suffix}`;
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) q.set(k, String(v));
    const qs = q.toString();
    return qs ? `${u}?${qs}` : u;
  }

  async #json(url, init = {}) {
    const res = await this.fetch(url, { ...init, headers: { ...this.headers, ...init.headers } });
    if (!res.ok) throw await apiError(res);
    return res.json();
  }

  /**
   * Delivers a message. Network failures and 5xx answers are retried with
   * the same Idempotency-Key and the same bytes, so a retry cannot admit a
   * second submission; a 4xx throws at once.
   */
  async send(agent, instance, message, { session, idempotencyKey = randomKey(), initialData, uid, retries = 4, signal } = {}) {
    const body = JSON.stringify({ message, session, initialData, uid });
    let last;
    for (let attempt = 0; attempt <= retries; attempt++) {
      if (attempt > 0) await sleep(Math.min(250 * 2 ** (attempt - 1), 4000), signal);
      if (signal?.aborted) break;
      let res;
      try {
        res = await this.fetch(this.url(agent, instance), {
          method: "POST",
          headers: { ...this.headers, "Content-Type": "application/json", "Idempotency-Key": idempotencyKey },
          body,
          signal,
        });
      } catch (err) {
        last = err;
        continue;
      }
      if (res.status >= 500) {
        last = await apiError(res);
        continue;
      }
      if (!res.ok) throw await apiError(res);
      const accepted = await res.json();
      accepted.replayed = res.headers.get("Idempotent-Replayed") === "true";
      accepted.idempotencyKey = idempotencyKey;
      return accepted;
    }
    throw last instanceof ConvlogError ? last : new ConvlogError(`delivery failed: ${last?.message ?? "aborted"}`, { code: "unreachable" });
  }

  /** A submission's status; wait (e.g. "30s") long-polls until it is terminal. */
  submission(agent, instance, id, { wait, signal } = {}) {
    return this.#json(this.url(agent, instance, `/submissions/${encodeURIComponent(id)}`, { wait }), { signal });
  }

  abort(agent, instance, id, { signal } = {}) {
    return this.#json(this.url(agent, instance, `/submissions/${encodeURIComponent(id)}/abort`), { method: "POST", signal });
  }

  /** One JSON page of records from offset. */
  page(agent, instance, { session, offset = "0", limit, signal } = {}) {
    return this.#json(this.url(agent, instance, "/conversation", { session, offset, limit }), { signal, headers: { Accept: "application/json" } });
  }

  /** Follows a conversation from offset (default "0"); see Follower. */
  follow(agent, instance, opts = {}) {
    return new Follower(this, agent, instance, opts);
  }

  /** Delivers a message and follows the conversation from its 202 offset until it settles. */
  async sendAndFollow(agent, instance, message, opts = {}) {
    const accepted = await this.send(agent, instance, message, opts);
    const follower = this.follow(agent, instance, { ...opts, offset: accepted.offset, until: accepted.submissionId });
    return { accepted, follower };
  }
}

// Why a follower's transport reconnects; reported in "connect" events.
const isAbort = (err) => err?.name === "AbortError" || err?.name === "TimeoutError";

class SSEUnavailable extends Error {}

/**
 * Follower tails one conversation and keeps its projected state. Events
 * (subscribe) are {type, follower, ...}: "status" (status changed),
 * "records" (a batch was applied), "delta" (a preview changed), "reset"
 * (the incarnation changed: everything derived was discarded), "connect"
 * (a transport attempt starts), "error", and "done" (it stopped).
 */
export class Follower {
  constructor(client, agent, instance, opts = {}) {
    this.client = client;
    this.agent = agent;
    this.instance = instance;
    this.session = opts.session;
    this.live = opts.live ?? "auto";
    if (!["auto", "sse", "poll"].includes(this.live)) throw new TypeError(`live must be "auto", "sse" or "poll", not ${this.live}`);
    this.idleTimeoutMs = opts.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    this.pollIntervalMs = opts.pollIntervalMs ?? 1000;
    this.minRetryMs = opts.minRetryMs ?? 250;
    this.maxRetryMs = opts.maxRetryMs ?? 5000;
    this.sseFailuresBeforePoll = opts.sseFailuresBeforePoll ?? 2;
    this.until = opts.until;

    this.offset = opts.offset ?? "0";
    this.incarnation = null;
    this.projector = new Projector();
    this.viewCache = undefined;
    /** @type {Map<string, {turnId: string, submissionId: string, parts: object[]}>} */
    this.previews = new Map();
    this.finishedTurns = new Set();
    this.transport = this.live === "poll" ? "poll" : "sse";
    this.status = "connecting";
    this.reconnects = 0;
    this.resets = 0;
    this.result = undefined;

    this.listeners = new Set();
    this.controller = new AbortController();
    this.done = new Promise((resolve) => (this.resolveDone = resolve));
    this.#run();
  }

  /** Calls fn with every event until the returned function is called. */
  subscribe(fn) {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** Stops following. */
  close() {
    this.#finish({ reason: "closed" });
  }

  /** Resolves when predicate(follower) holds, checked after every event. */
  waitFor(predicate, { signal } = {}) {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (predicate(this)) {
          off();
          resolve(this);
        } else if (this.result) {
          off();
          reject(new ConvlogError(`follower stopped (${this.result.reason}) before the condition held`, { code: "stopped" }));
        }
      };
      const off = this.subscribe(check);
      signal?.addEventListener("abort", () => {
        off();
        reject(signal.reason);
      });
      check();
    });
  }

  #emit(type, extra = {}) {
    const ev = { type, follower: this, ...extra };
    for (const fn of [...this.listeners]) {
      try {
        fn(ev);
      } catch (err) {
        queueMicrotask(() => {
          throw err;
        });
      }
    }
  }

  #setStatus(status) {
    if (this.status === status) return;
    this.status = status;
    this.#emit("status", { status });
  }

  #finish(result) {
    if (this.result) return;
    this.result = result;
    this.controller.abort();
    this.status = "closed";
    this.#emit("done", result);
    this.resolveDone(result);
  }

  get stopped() {
    return this.result !== undefined;
  }

  /**
   * The projection of every record read in this incarnation. It is copied
   * out of the projector when first asked for after a change, not per
   * batch: catching up on a long conversation stays linear.
   */
  get view() {
    this.viewCache ??= this.projector.view();
    return this.viewCache;
  }

  // reset discards everything derived from the stream: a new incarnation
  // means old offsets and records mean nothing.
  async #reset(incarnation, why) {
    this.projector = new Projector();
    this.viewCache = undefined;
    this.previews.clear();
    this.finishedTurns.clear();
    this.offset = "0";
    this.incarnation = incarnation ?? null;
    this.resets++;
    this.#emit("reset", { incarnation: this.incarnation, reason: why });
    // A submission settled in the old incarnation has no settlement in the
    // new one: only the status route can end the wait.
    if (this.until) {
      try {
        const sub = await this.client.submission(this.agent, this.instance, this.until, { signal: this.controller.signal });
        if (TERMINAL.has(sub.status)) this.#finish({ reason: "terminal", submission: sub });
      } catch {
        // The stream will tell, or the next reset will ask again.
      }
    }
  }

  // batch applies one durable batch at the current offset.
  #batch(incarnation, records, nextOffset) {
    this.incarnation = incarnation;
    this.projector.apply(...records);
    this.offset = nextOffset;
    for (const r of records) {
      const e = r?.kind === "entry" ? r.entry : undefined;
      if (!e) continue;
      if (e.type === "assistant_message" && e.turnId) this.previews.delete(e.turnId);
      if (e.type === "settlement") {
        if (e.turnId) {
          this.previews.delete(e.turnId);
          this.finishedTurns.add(e.turnId);
        }
        const sid = e.payload?.submissionId || e.submissionId;
        for (const [turn, p] of this.previews) if (p.submissionId === sid) this.previews.delete(turn);
      }
    }
    this.viewCache = undefined;
    this.#emit("records", { records, offset: nextOffset });
    if (this.until && this.projector.settled.has(this.until)) {
      const s = this.view.settlements.find((s) => s.submissionId === this.until);
      this.#finish({ reason: "settled", settlement: s });
    }
  }

  #delta(frame) {
    const turn = frame.turnId;
    if (!turn || this.finishedTurns.has(turn)) return;
    let p = this.previews.get(turn);
    if (!p) {
      p = { turnId: turn, submissionId: frame.submissionId ?? "", parts: [] };
      this.previews.set(turn, p);
    }
    if (frame.type === "delta") {
      const kind = frame.kind === "reasoning" ? "reasoning" : "text";
      const last = p.parts[p.parts.length - 1];
      if (last?.type === kind) last.text += frame.delta ?? "";
      else p.parts.push({ type: kind, text: frame.delta ?? "" });
    } else {
      p.parts.push({ type: "tool", toolCallId: frame.toolCallId, toolName: frame.toolName, state: "input-available", input: frame.args ?? null });
    }
    this.#emit("delta", { frame, preview: p });
  }

  // frame handles one SSE data frame; it returns a reason to reconnect, if any.
  async #frame(frame, id) {
    switch (frame?.type) {
      case "conversation": {
        if (this.incarnation !== null && frame.incarnation !== this.incarnation) {
          // Where the batch starts: batchOffset on servers whose offset is
          // the resume point, offset on older ones.
          const from = frame.batchOffset ?? frame.offset;
          await this.#reset(frame.incarnation, "incarnation");
          if (from !== "0") return "incarnation";
        }
        this.#batch(frame.incarnation, frame.records ?? [], id ?? frame.nextOffset);
        return;
      }
      case "delta":
      case "toolcall_delta":
        this.#delta(frame);
        return;
      case "retrying":
        this.#emit("retrying", { frame });
        return;
      case "reset":
        // The stream was reset under us: a new incarnation, read from its start.
        await this.#reset(frame.incarnation, "reset");
        return "incarnation";
      case "ended":
        // The conversation was deleted: it reads as absent until a new
        // delivery starts a new one, which we then read from "0".
        this.#emit("ended", { frame });
        await this.#reset(null, "ended");
        return "incarnation";
      case "error":
        if (frame.code === "unknown_offset") {
          await this.#reset(frame.incarnation, "unknown_offset");
          return "unknown_offset";
        }
        if (frame.code === "reader_too_slow") {
          if (typeof frame.offset === "string") this.offset = frame.offset;
          return "reader_too_slow";
        }
        this.#emit("error", { error: new ConvlogError(frame.message ?? frame.code, { code: frame.code }) });
        return "server_error";
    }
    // Unknown frame types are ignored: newer servers may add some. One
    // that names another incarnation (a reset announced to live readers)
    // still means every offset of ours is void.
    if (typeof frame?.incarnation === "string" && this.incarnation !== null && frame.incarnation !== this.incarnation) {
      await this.#reset(frame.incarnation, "incarnation");
      return "incarnation";
    }
  }

  async #run() {
    let failures = 0; // consecutive failed attempts, for the backoff
    let sseFailures = 0; // consecutive SSE attempts that never connected
    let reason = "start";
    while (!this.stopped) {
      const attemptCtl = new AbortController();
      const onStop = () => attemptCtl.abort();
      this.controller.signal.addEventListener("abort", onStop, { once: true });
      this.#emit("connect", { transport: this.transport, reason, offset: this.offset });
      if (reason !== "start") this.reconnects++;
      let progressed = false;
      try {
        if (this.transport === "sse") {
          const r = await this.#sse(attemptCtl, () => {
            progressed = true;
            sseFailures = 0;
          });
          reason = r.reason;
          if (!r.connected && ++sseFailures >= this.sseFailuresBeforePoll && this.live === "auto") {
            this.transport = "poll";
            reason = "sse_unavailable";
          }
        } else {
          reason = await this.#poll(attemptCtl, () => (progressed = true));
        }
        failures = progressed || reason === "unknown_offset" || reason === "incarnation" ? 0 : failures + 1;
      } catch (err) {
        if (this.stopped) break;
        if (err instanceof SSEUnavailable) {
          if (this.live === "auto") {
            this.transport = "poll";
            reason = "sse_unavailable";
            continue;
          }
          failures++;
          reason = "sse_unavailable";
        } else if (err instanceof ConvlogError && err.code === "unknown_offset") {
          await this.#reset(err.incarnation, "unknown_offset");
          reason = "unknown_offset";
          failures = 0;
          continue;
        } else if (err instanceof ConvlogError && err.status >= 400 && err.status < 500 && err.code !== "") {
          // A client mistake (unknown agent, bad name): retrying cannot help.
          this.#emit("error", { error: err });
          this.#finish({ reason: "error", error: err });
          break;
        } else {
          failures++;
          reason = isAbort(err) ? "idle" : "network";
          if (this.transport === "sse" && err instanceof ConvlogError && err.code === "") sseFailures++;
          if (this.transport === "sse" && this.live === "auto" && sseFailures >= this.sseFailuresBeforePoll) {
            this.transport = "poll";
            reason = "sse_unavailable";
          }
          this.#emit("error", { error: err });
        }
      } finally {
        this.controller.signal.removeEventListener("abort", onStop);
      }
      if (this.stopped) break;
      this.#setStatus("reconnecting");
      if (failures > 0 && reason !== "idle") {
        await sleep(Math.min(this.minRetryMs * 2 ** (failures - 1), this.maxRetryMs), this.controller.signal);
      }
    }
  }

  // sse runs one SSE connection until it ends; it resolves with why it
  // ended and whether it ever connected.
  async #sse(ctl, onProgress) {
    let connected = false;
    let idle;
    const arm = () => {
      clearTimeout(idle);
      idle = setTimeout(() => ctl.abort(new DOMException("no bytes within idleTimeoutMs", "TimeoutError")), this.idleTimeoutMs);
    };
    arm();
    try {
      const headers = { ...this.client.headers, Accept: "text/event-stream" };
      // Last-Event-ID wins over offset on the server: it is how a resume is
      // spelled in SSE. "0" needs neither.
      if (this.offset !== "0") headers["Last-Event-ID"] = this.offset;
      const res = await this.client.fetch(this.client.url(this.agent, this.instance, "/stream", { session: this.session, offset: this.offset }), {
        headers,
        signal: ctl.signal,
        cache: "no-store",
      });
      if (!res.ok) {
        const err = await apiError(res);
        // Not convlog answering (a proxy page, say): SSE is not reachable.
        if (err.code === "" && res.status < 500) throw new SSEUnavailable(`stream answered HTTP ${res.status}`);
        throw err;
      }
      if (!(res.headers.get("Content-Type") ?? "").startsWith("text/event-stream")) {
        res.body?.cancel().catch(() => {});
        throw new SSEUnavailable(`stream answered ${res.headers.get("Content-Type")}`);
      }
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      let data = [];
      let id;
      let sawCR = false;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return { reason: "closed", connected };
        arm();
        let chunk = value;
        if (sawCR && chunk.startsWith("\n")) chunk = chunk.slice(1);
        sawCR = chunk.endsWith("\r");
        buf += chunk;
        const lines = buf.split(/\r\n|\r|\n/);
        buf = lines.pop();
        for (const line of lines) {
          if (line === "") {
            if (data.length > 0) {
              let frame;
              try {
                frame = JSON.parse(data.join("\n"));
              } catch {
                frame = undefined;
              }
              data = [];
              const eid = id;
              id = undefined;
              const why = await this.#frame(frame, eid);
              if (frame?.type === "conversation") onProgress();
              if (this.stopped) return { reason: "stopped", connected };
              if (why) {
                ctl.abort();
                return { reason: why, connected: true };
              }
            }
            id = undefined;
            continue;
          }
          if (line.startsWith(":")) {
            if (!connected && line.startsWith(": connected")) {
              connected = true;
              onProgress();
              this.#setStatus("live");
            }
            continue;
          }
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let v = colon < 0 ? "" : line.slice(colon + 1);
          if (v.startsWith(" ")) v = v.slice(1);
          if (field === "data") data.push(v);
          else if (field === "id") id = v;
        }
      }
    } catch (err) {
      if (isAbort(err) || ctl.signal.aborted) {
        if (this.stopped) return { reason: "stopped", connected };
        const r = ctl.signal.reason;
        if (r?.name === "TimeoutError") return { reason: "idle", connected };
      }
      throw err;
    } finally {
      clearTimeout(idle);
      ctl.abort();
    }
  }

  // poll reads pages until it fails; a page that reached the tail waits
  // pollIntervalMs before the next.
  async #poll(ctl, onProgress) {
    for (;;) {
      const timeout = AbortSignal.any
        ? AbortSignal.any([ctl.signal, AbortSignal.timeout(this.idleTimeoutMs)])
        : ctl.signal;
      const page = await this.client.page(this.agent, this.instance, { session: this.session, offset: this.offset, signal: timeout });
      onProgress();
      this.#setStatus("polling");
      // Before the first page there is nothing to discard: an offset the
      // current incarnation did not produce is refused (unknown_offset).
      if (this.incarnation !== null && page.incarnation !== this.incarnation) {
        await this.#reset(page.incarnation, "incarnation");
        if (this.stopped) return "stopped";
        return "incarnation"; // read the new incarnation from "0"
      }
      this.incarnation = page.incarnation;
      for (const b of page.batches) {
        const i = page.batches.indexOf(b);
        const next = i + 1 < page.batches.length ? page.batches[i + 1].offset : page.nextOffset;
        this.#batch(page.incarnation, b.records, next);
        if (this.stopped) return "stopped";
      }
      this.offset = page.nextOffset;
      if (page.upToDate) await sleep(this.pollIntervalMs, ctl.signal);
      if (this.stopped) return "stopped";
    }
  }
}
