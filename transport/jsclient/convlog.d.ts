// Types of convlog.js.
import type { Projector, StreamRecord, View, Settlement, JSONValue } from "./projection.js";

export * from "./projection.js";

export declare const DEFAULT_IDLE_TIMEOUT_MS: 90000;

export declare class ConvlogError extends Error {
  /** HTTP status; 0 for a transport failure. */
  status: number;
  /** convlog's error code ("not_found", "unknown_offset", ...); "" when the answer was not convlog's. */
  code: string;
  body: unknown;
  /** On unknown_offset: the stream's current incarnation (null when it does not exist). */
  incarnation?: string | null;
}

export type UserPart =
  | { type: "text"; text: string }
  | { type: "file"; mediaType: string; url: string; filename?: string }
  | { type: "data"; name?: string; data: JSONValue };

export type UserMessage =
  | string
  | {
      kind: "user";
      body?: string;
      parts?: UserPart[];
      purpose?: "user" | "dispatch" | "advisory";
      display?: "visible" | "hidden" | "diagnostic";
      metadata?: Record<string, JSONValue>;
    };

export interface Accepted {
  submissionId: string;
  /** Opaque: the stream position just before the message. Compare for equality only. */
  offset: string;
  conversationUrl: string;
  streamUrl: string;
  updatesUrl: string;
  /** True when this answer replays an earlier request with the same Idempotency-Key. */
  replayed: boolean;
  idempotencyKey: string;
}

export interface SubmissionStatus {
  submissionId: string;
  offset: string;
  status: "admitted" | "running" | "completed" | "failed" | "aborted";
  entryId: string;
  turnId?: string;
  error?: { code: string; message: string; retryable: boolean };
  answeredBySubmissionId?: string;
  admittedAt: string;
  startedAt?: string;
  settledAt?: string;
}

export interface Page {
  incarnation: string | null;
  batches: { offset: string; records: StreamRecord[] }[];
  nextOffset: string;
  upToDate: boolean;
}

export interface SendOptions {
  session?: string;
  /** Default: a random key, kept for every retry of this delivery. */
  idempotencyKey?: string;
  initialData?: JSONValue;
  uid?: string;
  /** Retries after a network error or a 5xx, same key and bytes. Default 4. */
  retries?: number;
  signal?: AbortSignal;
}

export type Live = "auto" | "sse" | "poll";

export interface FollowOptions {
  session?: string;
  /** Where to start: "0" (default) or an offset the server gave. */
  offset?: string;
  /** "auto" (default): SSE, falling back to polling when SSE fails. */
  live?: Live;
  /** Reconnect after this long without a byte. Default 90,000. */
  idleTimeoutMs?: number;
  /** Wait between polls at the tail. Default 1,000. */
  pollIntervalMs?: number;
  /** Backoff bounds between failed attempts. Defaults 250 and 5,000. */
  minRetryMs?: number;
  maxRetryMs?: number;
  /** Under "auto": SSE attempts that never connected before polling. Default 2. */
  sseFailuresBeforePoll?: number;
  /** Stop once this submission is settled (in the stream, or by the status route after a reset). */
  until?: string;
}

/** A running turn's live text, reasoning and tool calls: for rendering only, never stored. */
export interface Preview {
  turnId: string;
  submissionId: string;
  parts: (
    | { type: "text" | "reasoning"; text: string }
    | { type: "tool"; toolCallId: string; toolName: string; state: "input-available"; input: JSONValue }
  )[];
}

export type FollowerStatus = "connecting" | "live" | "polling" | "reconnecting" | "closed";

export type DoneResult =
  | { reason: "closed" }
  | { reason: "settled"; settlement: Settlement }
  | { reason: "terminal"; submission: SubmissionStatus }
  | { reason: "error"; error: ConvlogError };

export type FollowerEvent =
  | { type: "status"; follower: Follower; status: FollowerStatus }
  | { type: "records"; follower: Follower; records: StreamRecord[]; offset: string }
  | { type: "delta"; follower: Follower; frame: Record<string, unknown>; preview: Preview }
  | { type: "reset"; follower: Follower; incarnation: string | null; reason: "incarnation" | "unknown_offset" | "reset" | "ended" }
  | { type: "ended"; follower: Follower; frame: Record<string, unknown> }
  | { type: "connect"; follower: Follower; transport: "sse" | "poll"; reason: string; offset: string }
  | { type: "retrying"; follower: Follower; frame: Record<string, unknown> }
  | { type: "error"; follower: Follower; error: Error }
  | ({ type: "done"; follower: Follower } & DoneResult);

export declare class Follower {
  readonly agent: string;
  readonly instance: string;
  readonly session?: string;
  readonly live: Live;
  /** Opaque: where the next read continues. */
  readonly offset: string;
  readonly incarnation: string | null;
  /** The projection of every record read in this incarnation. */
  readonly view: View;
  readonly projector: Projector;
  /** Live previews of running turns, by turnId. */
  readonly previews: Map<string, Preview>;
  readonly transport: "sse" | "poll";
  readonly status: FollowerStatus;
  readonly reconnects: number;
  readonly resets: number;
  readonly stopped: boolean;
  readonly done: Promise<DoneResult>;
  subscribe(fn: (event: FollowerEvent) => void): () => void;
  waitFor(predicate: (f: Follower) => boolean, opts?: { signal?: AbortSignal }): Promise<Follower>;
  close(): void;
}

export declare class Client {
  constructor(opts?: { baseUrl?: string; fetch?: typeof fetch; headers?: Record<string, string> });
  readonly baseUrl: string;
  url(agent: string, instance: string, suffix?: string, query?: Record<string, string | number | undefined | null>): string;
  send(agent: string, instance: string, message: UserMessage, opts?: SendOptions): Promise<Accepted>;
  submission(agent: string, instance: string, id: string, opts?: { wait?: string; signal?: AbortSignal }): Promise<SubmissionStatus>;
  abort(agent: string, instance: string, id: string, opts?: { signal?: AbortSignal }): Promise<SubmissionStatus>;
  page(agent: string, instance: string, opts?: { session?: string; offset?: string; limit?: number; signal?: AbortSignal }): Promise<Page>;
  follow(agent: string, instance: string, opts?: FollowOptions): Follower;
  sendAndFollow(
    agent: string,
    instance: string,
    message: UserMessage,
    opts?: SendOptions & FollowOptions,
  ): Promise<{ accepted: Accepted; follower: Follower }>;
}
