// Reads cases of {records, view} written by the Go test
// (TestProjectionMatchesGo: random conversations and Go's projection of
// each) and checks that project() gives the same view, as JSON text.
import { readFileSync } from "node:fs";
import { project, Projector } from "../projection.js";

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
let bad = 0;
for (const [i, c] of cases.entries()) {
  const want = JSON.stringify(c.view);
  const got = JSON.stringify(project(c.records));
  // And fed in two halves, as a follower would.
  const p = new Projector();
  const records = c.records ?? [];
  const half = Math.floor(records.length / 2);
  p.apply(...records.slice(0, half));
  p.apply(...records.slice(half));
  const split = JSON.stringify(p.view());
  if (got !== want || split !== want) {
    if (bad++ < 3) {
      console.log(`case ${i}:\nrecords ${JSON.stringify(c.records)}\n   want ${want}\n    got ${got}\n  split ${split}`);
    }
  }
}
console.log(`${cases.length} cases, ${bad} differ`);
process.exit(bad === 0 ? 0 : 1);
