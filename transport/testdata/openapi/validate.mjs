// Validates an OpenAPI document against the OpenAPI 3.1 schema and resolves
// every $ref; with a samples file, also checks real response bodies
// against the document's schemas:
//
//	node validate.mjs OPENAPI.json [SAMPLES.json]
//
// SAMPLES.json is [{"name": "...", "schema": "Accepted", "body": {...}}];
// schema is a component's name or a JSON pointer ("#/paths/...").
import { readFile } from "node:fs/promises";
import SwaggerParser from "@apidevtools/swagger-parser";
import Ajv2020 from "ajv/dist/2020.js";

const [file, samplesFile] = process.argv.slice(2);
if (!file) {
  console.error("usage: node validate.mjs OPENAPI.json [SAMPLES.json]");
  process.exit(2);
}
let api;
try {
  // validate dereferences in place: parse a copy for the samples.
  api = await SwaggerParser.validate(file);
  console.log(`${file}: valid OpenAPI ${api.openapi}, ${Object.keys(api.paths).length} paths`);
} catch (err) {
  console.error(`${file}: invalid: ${err.message}`);
  process.exit(1);
}
if (samplesFile) {
  const doc = JSON.parse(await readFile(file, "utf8"));
  const samples = JSON.parse(await readFile(samplesFile, "utf8"));
  // The document is not a JSON Schema, but its components are: unknown
  // keywords of the OpenAPI envelope are ignored (strict: false).
  const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
  ajv.addSchema(doc, "openapi.json");
  let failed = 0;
  for (const s of samples) {
    // A schema is a component's name, or a JSON pointer into the document
    // ("#/paths/...") for a response described in place.
    const ref = s.schema.startsWith("#/") ? s.schema : `#/components/schemas/${s.schema}`;
    const validate = ajv.getSchema(`openapi.json${ref}`);
    if (!validate) {
      console.error(`${s.name}: no schema ${s.schema}`);
      failed++;
      continue;
    }
    if (!validate(s.body)) {
      console.error(`${s.name}: does not match ${s.schema}: ${ajv.errorsText(validate.errors)}`);
      failed++;
    }
  }
  if (failed > 0) {
    process.exit(1);
  }
  console.log(`${samples.length} response bodies match their schemas`);
}
