// The JS projection must give the Go package's views on the Go package's
// golden records, byte for byte in the Go encoder's indented form.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import { project, Projector } from "../projection.js";

const testdata = fileURLToPath(new URL("../../../projection/testdata/", import.meta.url));
const names = readdirSync(testdata).filter((f) => f.endsWith(".records.json")).map((f) => f.slice(0, -".records.json".length));

test("golden files exist", () => {
  assert.ok(names.length >= 3, `found ${names}`);
});

for (const name of names) {
  const records = JSON.parse(readFileSync(join(testdata, `${name}.records.json`), "utf8"));
  const golden = readFileSync(join(testdata, `${name}.golden`), "utf8");

  test(`golden ${name}: project equals the Go view`, () => {
    assert.equal(JSON.stringify(project(records), null, 2) + "\n", golden);
  });

  test(`golden ${name}: every split into batches gives the same view`, () => {
    for (let size = 1; size <= records.length; size++) {
      const p = new Projector();
      for (let i = 0; i < records.length; i += size) p.apply(...records.slice(i, i + size));
      assert.equal(JSON.stringify(p.view(), null, 2) + "\n", golden, `batches of ${size}`);
    }
  });
}

test("a view is a copy: later records leave it as it was", () => {
  const records = JSON.parse(readFileSync(join(testdata, "tools.records.json"), "utf8"));
  const p = new Projector();
  p.apply(...records.slice(0, 2));
  const early = p.view();
  const before = JSON.stringify(early);
  p.apply(...records.slice(2));
  assert.equal(JSON.stringify(early), before);
});

test("records the engine never writes are skipped, not fatal", () => {
  const v = project([
    { kind: "checkpoint" },
    null,
    { kind: "entry", entry: { id: "a", parentId: "a", type: "x", payload: null } },
    { kind: "entry", entry: { id: "b", parentId: "z", type: "user_message", payload: { parts: "no" } } },
    { kind: "entry", entry: { id: "c", type: "user_message", payload: { parts: [{ type: "sparkle" }, { type: "text", text: "hi" }] } } },
    { kind: "truncated", rewoundTo: "never", newLeafId: "" },
    { kind: "entry", entry: { id: "s", parentId: "c", type: "settlement", submissionId: "q", payload: { outcome: "failed", error: { message: "m" } } } },
  ]);
  assert.deepEqual(v, {
    messages: [{ id: "c", role: "user", purpose: "user", display: "visible", parts: [{ type: "text", text: "hi" }] }],
    settlements: [{ submissionId: "q", outcome: "failed", error: { message: "m", retryable: false } }],
  });
});

// Found by TestProjectionMatchesGo: Go's errorText of a null output is "",
// since decoding null into a string changes nothing.
test("a failed tool result with a null output has an empty errorText", () => {
  const v = project([
    { kind: "entry", entry: { id: "a", parentId: "", type: "assistant_message", payload: { parts: [{ type: "tool-call", toolCallId: "c", toolName: "t", input: {} }] } } },
    { kind: "entry", entry: { id: "r", parentId: "a", type: "tool_result", payload: { toolCallId: "c", isError: true, output: null } } },
  ]);
  assert.deepEqual(v.messages[0].parts[0], { type: "tool", toolCallId: "c", toolName: "t", state: "output-error", input: {}, output: null, errorText: "" });
});
