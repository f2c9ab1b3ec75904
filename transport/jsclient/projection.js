// A port of convlog's Go package projection: the reducer from a
// conversation's records to the view a UI renders (the messages on the
// active path, each tool call joined to its result, and the settlements).
// Its output equals the Go package's, field for field and in the same key
// order, on the same records: the tests check it on projection/testdata.
//
// The rules (see projection/doc.go): entries form a tree through parentId;
// an entry whose parent is not the leaf branches there; a truncated record
// moves the leaf to newLeafId (rewoundTo when empty, "" the very start).
// Settlements are never removed by truncation; the first per submission
// wins. The projection never fails: what it cannot read it skips.

export const PART_TOOL = "tool";
export const STATE_INPUT_AVAILABLE = "input-available";
export const STATE_OUTPUT_AVAILABLE = "output-available";
export const STATE_OUTPUT_ERROR = "output-error";

const ENTRY_USER = "user_message";
const ENTRY_ASSISTANT = "assistant_message";
const ENTRY_TOOL_RESULT = "tool_result";
const ENTRY_SETTLEMENT = "settlement";

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

// Go's encoding/json refuses a field of the wrong JSON type, which makes the
// whole payload undecodable; these checks give the same verdicts.
const optString = (v) => v === undefined || v === null || typeof v === "string";
const optBool = (v) => v === undefined || v === null || typeof v === "boolean";
const str = (v) => (typeof v === "string" ? v : "");

function decodePart(p) {
  if (p === null) return { type: "" };
  if (!isObject(p)) return undefined;
  for (const k of ["type", "text", "toolCallId", "toolName", "mediaType", "url", "filename", "name"]) {
    if (!optString(p[k])) return undefined;
  }
  return p;
}

// decodeMessage is log.MessagePayload's decoding: undefined when Go's
// json.Unmarshal would fail.
function decodeMessage(payload) {
  if (payload === null) return { parts: [] };
  if (!isObject(payload)) return undefined;
  if (!optString(payload.purpose) || !optString(payload.display)) return undefined;
  const parts = payload.parts;
  if (parts !== undefined && parts !== null && !Array.isArray(parts)) return undefined;
  const decoded = [];
  for (const p of parts ?? []) {
    const d = decodePart(p);
    if (d === undefined) return undefined;
    decoded.push(d);
  }
  const m = payload.metadata;
  return { purpose: str(payload.purpose), display: str(payload.display), parts: decoded, metadata: m };
}

function decodeToolResult(payload) {
  if (payload === null) return { toolCallId: "", toolName: "", isError: false, output: undefined };
  if (!isObject(payload)) return undefined;
  if (!optString(payload.toolCallId) || !optString(payload.toolName) || !optBool(payload.isError)) return undefined;
  return {
    toolCallId: str(payload.toolCallId),
    toolName: str(payload.toolName),
    isError: payload.isError === true,
    output: payload.output,
  };
}

function decodeSettlement(payload) {
  if (payload === null) return { submissionId: "", outcome: "" };
  if (!isObject(payload)) return undefined;
  if (!optString(payload.submissionId) || !optString(payload.outcome) || !optString(payload.answeredBySubmissionId)) return undefined;
  const s = { submissionId: str(payload.submissionId), outcome: str(payload.outcome) };
  const e = payload.error;
  if (e !== undefined && e !== null) {
    if (!isObject(e) || !optString(e.code) || !optString(e.message) || !optBool(e.retryable)) return undefined;
    s.error = {};
    if (str(e.code) !== "") s.error.code = e.code;
    s.error.message = str(e.message);
    s.error.retryable = e.retryable === true;
  }
  if (str(payload.answeredBySubmissionId) !== "") s.answeredBySubmissionId = payload.answeredBySubmissionId;
  return s;
}

// A raw JSON value in Go is absent when its key is missing; null is kept.
const present = (v) => v !== undefined;

function partFromPayload(p) {
  switch (p.type) {
    case "text":
    case "reasoning":
      return { type: p.type, text: str(p.text) };
    case "tool-call":
      return { type: PART_TOOL, toolCallId: str(p.toolCallId), toolName: str(p.toolName), state: STATE_INPUT_AVAILABLE, input: p.input };
    case "file":
      return { type: "file", mediaType: str(p.mediaType), url: str(p.url), filename: str(p.filename) };
    case "data":
      return { type: "data", name: str(p.name), data: p.data };
  }
  return undefined;
}

function errorText(output) {
  // Go decodes a JSON null into a string as no change: "".
  if (!present(output) || output === null) return "";
  if (typeof output === "string") return output;
  return JSON.stringify(output);
}

function withResult(part, r) {
  const p = { ...part, output: r.output };
  if (p.toolName === "") p.toolName = r.toolName;
  if (r.isError) {
    p.state = STATE_OUTPUT_ERROR;
    p.errorText = errorText(r.output);
  } else {
    p.state = STATE_OUTPUT_AVAILABLE;
    p.errorText = "";
  }
  return p;
}

const nullIfAbsent = (v) => (present(v) ? v : null);

// wirePart is Part.MarshalJSON: exactly the fields of the part's type.
function wirePart(p) {
  switch (p.type) {
    case "text":
    case "reasoning":
      return { type: p.type, text: p.text };
    case PART_TOOL: {
      const t = { type: p.type, toolCallId: p.toolCallId, toolName: p.toolName, state: p.state, input: nullIfAbsent(p.input) };
      if (p.state === STATE_OUTPUT_AVAILABLE) t.output = nullIfAbsent(p.output);
      else if (p.state === STATE_OUTPUT_ERROR) {
        if (present(p.output)) t.output = p.output;
        t.errorText = p.errorText;
      }
      return t;
    }
    case "file": {
      const f = { type: p.type, mediaType: p.mediaType, url: p.url };
      if (p.filename !== "") f.filename = p.filename;
      return f;
    }
    case "data":
      return { type: p.type, name: p.name, data: nullIfAbsent(p.data) };
  }
  return { ...p };
}

function newMessage(e, pl, role, purpose) {
  return {
    id: e.id,
    role,
    purpose: pl.purpose || purpose,
    display: pl.display || "visible",
    submissionId: str(e.submissionId),
    turnId: str(e.turnId),
    metadata: pl.metadata === null ? undefined : pl.metadata,
    parts: pl.parts.map(partFromPayload).filter((p) => p !== undefined),
  };
}

function wireMessage(m) {
  const w = { id: m.id, role: m.role, purpose: m.purpose, display: m.display };
  if (m.submissionId !== "") w.submissionId = m.submissionId;
  if (m.turnId !== "") w.turnId = m.turnId;
  if (present(m.metadata)) w.metadata = m.metadata;
  w.parts = m.parts.map(wirePart);
  return w;
}

function truncationLeaf(r, known) {
  let leaf = str(r.newLeafId);
  if (leaf === "") leaf = str(r.rewoundTo);
  return { leaf, ok: leaf === "" || known(leaf) };
}

const deepCopy = (v) => (v === undefined ? undefined : structuredClone(v));

/**
 * Projector keeps a view up to date as records arrive. Feeding records in
 * any number of apply calls gives the view project gives for all of them.
 */
export class Projector {
  constructor() {
    this.nodes = new Map(); // every entry seen: id -> {entry, parent}
    this.path = []; // frames, root first: {node, msg, result}
    this.onPath = new Map(); // id -> index in path
    this.messages = [];
    this.calls = new Map(); // toolCallId -> [{msg, part}] in path order
    this.settlements = [];
    this.settled = new Set();
  }

  /** Advances the view by records, in order. */
  apply(...records) {
    for (const r of records) {
      if (!isObject(r)) continue;
      if (r.kind === "entry") this.#entry(r.entry);
      else if (r.kind === "truncated") {
        const { leaf, ok } = truncationLeaf(r, (id) => this.nodes.has(id));
        if (ok) this.#checkout(leaf);
      }
    }
  }

  /** The current view, in the Go package's wire shape; a copy. */
  view() {
    return {
      messages: this.messages.map((m) => deepCopy(wireMessage(m))),
      settlements: this.settlements.map(deepCopy),
    };
  }

  #leaf() {
    return this.path.length === 0 ? "" : this.path[this.path.length - 1].node.entry.id;
  }

  #entry(e) {
    if (!isObject(e) || typeof e.id !== "string" || e.id === "" || this.nodes.has(e.id)) return;
    // The payload may be replayed when a branch rejoins the path: keep our own copy.
    const entry = { ...e, payload: deepCopy(e.payload) };
    const n = { entry, parent: str(e.parentId) };
    if (n.parent !== "" && !this.nodes.has(n.parent)) n.parent = this.#leaf();
    this.nodes.set(e.id, n);
    this.#checkout(n.parent);
    this.#push(n);
    if (entry.type === ENTRY_SETTLEMENT) this.#settle(entry);
  }

  #checkout(leaf) {
    if (leaf === this.#leaf()) return;
    const rejoin = [];
    let depth = 0;
    for (let id = leaf; id !== ""; ) {
      const i = this.onPath.get(id);
      if (i !== undefined) {
        depth = i + 1;
        break;
      }
      const n = this.nodes.get(id);
      rejoin.push(n);
      id = n.parent;
    }
    while (this.path.length > depth) this.#pop();
    for (let i = rejoin.length - 1; i >= 0; i--) this.#push(rejoin[i]);
  }

  #push(n) {
    const f = { node: n, msg: -1, result: null };
    const e = n.entry;
    if (e.type === ENTRY_USER || e.type === ENTRY_ASSISTANT) {
      const pl = decodeMessage(e.payload === undefined ? null : e.payload);
      if (pl !== undefined) {
        const [role, purpose] = e.type === ENTRY_ASSISTANT ? ["assistant", "assistant"] : ["user", "user"];
        f.msg = this.messages.length;
        const m = newMessage(e, pl, role, purpose);
        m.parts.forEach((part, j) => {
          if (part.type !== PART_TOOL) return;
          const refs = this.calls.get(part.toolCallId) ?? [];
          refs.push({ msg: f.msg, part: j });
          this.calls.set(part.toolCallId, refs);
        });
        this.messages.push(m);
      }
    } else if (e.type === ENTRY_TOOL_RESULT) {
      const r = decodeToolResult(e.payload === undefined ? null : e.payload);
      const refs = r === undefined ? undefined : this.calls.get(r.toolCallId);
      if (refs !== undefined && refs.length > 0) {
        const at = refs[refs.length - 1];
        const parts = this.messages[at.msg].parts;
        f.result = { at, prev: parts[at.part] };
        parts[at.part] = withResult(parts[at.part], r);
      }
    }
    this.onPath.set(e.id, this.path.length);
    this.path.push(f);
  }

  #pop() {
    const f = this.path.pop();
    this.onPath.delete(f.node.entry.id);
    if (f.result !== null) this.messages[f.result.at.msg].parts[f.result.at.part] = f.result.prev;
    if (f.msg >= 0) {
      const parts = this.messages[f.msg].parts;
      for (let j = parts.length - 1; j >= 0; j--) {
        if (parts[j].type !== PART_TOOL) continue;
        const id = parts[j].toolCallId;
        const refs = this.calls.get(id);
        if (refs.length > 1) refs.pop();
        else this.calls.delete(id);
      }
      this.messages.length = f.msg;
    }
  }

  #settle(e) {
    const s = decodeSettlement(e.payload === undefined ? null : e.payload);
    if (s === undefined) return;
    if (s.submissionId === "") s.submissionId = str(e.submissionId);
    if (s.submissionId === "" || s.outcome === "" || this.settled.has(s.submissionId)) return;
    this.settled.add(s.submissionId);
    // Key order of log.Settlement's JSON.
    const w = { submissionId: s.submissionId, outcome: s.outcome };
    if (s.error) w.error = s.error;
    if (s.answeredBySubmissionId) w.answeredBySubmissionId = s.answeredBySubmissionId;
    this.settlements.push(w);
  }
}

/** The view of records read from the start of a stream. */
export function project(records) {
  const p = new Projector();
  p.apply(...(records ?? []));
  return p.view();
}
