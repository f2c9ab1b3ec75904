// Types of projection.js: the Go package projection's view, on the wire.

export declare const PART_TOOL: "tool";
export declare const STATE_INPUT_AVAILABLE: "input-available";
export declare const STATE_OUTPUT_AVAILABLE: "output-available";
export declare const STATE_OUTPUT_ERROR: "output-error";

/** Any JSON value, as stored: inputs, outputs, data and metadata. */
export type JSONValue = null | boolean | number | string | JSONValue[] | { [key: string]: JSONValue };

export type TextPart = { type: "text"; text: string };
export type ReasoningPart = { type: "reasoning"; text: string };
export type ToolPart = {
  type: "tool";
  toolCallId: string;
  toolName: string;
  state: "input-available" | "output-available" | "output-error";
  input: JSONValue;
  /** Present once a result arrived (on output-error only if the result had one). */
  output?: JSONValue;
  /** On output-error: the output when it is a string, else its JSON text. */
  errorText?: string;
};
export type FilePart = { type: "file"; mediaType: string; url: string; filename?: string };
export type DataPart = { type: "data"; name: string; data: JSONValue };
export type Part = TextPart | ReasoningPart | ToolPart | FilePart | DataPart;

export interface Message {
  id: string;
  role: "user" | "assistant";
  /** "user", "assistant", "dispatch", "advisory", or a newer producer's value. */
  purpose: string;
  /** "visible", "hidden", "diagnostic", or a newer producer's value. */
  display: string;
  submissionId?: string;
  turnId?: string;
  metadata?: JSONValue;
  parts: Part[];
}

export interface Failure {
  code?: string;
  message: string;
  retryable: boolean;
}

export interface Settlement {
  submissionId: string;
  outcome: "completed" | "failed" | "aborted" | string;
  error?: Failure;
  answeredBySubmissionId?: string;
}

export interface View {
  messages: Message[];
  settlements: Settlement[];
}

export interface Entry {
  id: string;
  parentId: string;
  timestamp: string;
  type: "user_message" | "assistant_message" | "tool_result" | "settlement" | string;
  submissionId?: string;
  turnId?: string;
  payload: JSONValue;
}

export type StreamRecord =
  | { kind: "entry"; entry: Entry }
  | { kind: "truncated"; rewoundTo: string; newLeafId: string; reason: string }
  | { kind: string; [key: string]: unknown };

/** Keeps a view up to date as records arrive; any split into apply calls gives project's view. */
export declare class Projector {
  constructor();
  apply(...records: StreamRecord[]): void;
  /** A deep copy: later apply calls leave it as it is. */
  view(): View;
}

/** The view of records read from the start of a stream. */
export declare function project(records: StreamRecord[]): View;
