// Checks custom resources against the upstream CRD schemas of the pinned @kubernetes-models packages.
//
//   node validate.mjs < manifests.json > results.json
//
// stdin: [{"id": "...", "manifest": {...}}, ...]; stdout: [{"id": "...", "errors": ["..."]}, ...], one entry
// per input in order, errors empty when the manifest passes. Exit 0 whatever the verdicts; 2 on bad input.
//
// Two checks per manifest, both from the same package, generated from the upstream CRDs or Go API types:
//  1. the package's compiled JSON-schema validator: types, required fields, enums, patterns, bounds;
//  2. the package's TypeScript declarations, through the TypeScript compiler: an unknown field (a typo, a
//     field of another version) is an error there. The API server drops or rejects such a field; the JSON
//     schemas of CRDs do not forbid them, so check 1 alone would let it through.
// A kind that no package covers is an error: every custom resource we render must be checked.

import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const HERE = dirname(fileURLToPath(import.meta.url));
const PACKAGES = [
  "@kubernetes-models/keda",
  "@kubernetes-models/prometheus-operator",
  "@kubernetes-models/gateway-api",
  "@kubernetes-models/envoy-gateway",
  "@kubernetes-models/karpenter",
];

/** "apiVersion/kind" -> {model class, module to import its type from}, from every package's exports. */
async function registry() {
  const out = new Map();
  for (const pkg of PACKAGES) {
    const walk = (node, depth) => {
      for (const value of Object.values(node)) {
        if (typeof value === "function" && typeof value.apiVersion === "string" && typeof value.kind === "string") {
          const key = `${value.apiVersion}/${value.kind}`;
          out.set(key, { model: value, module: `${pkg}/${value.apiVersion}/${value.kind}` });
        } else if (value && typeof value === "object" && depth < 3) {
          walk(value, depth + 1);
        }
      }
    };
    walk(await import(pkg), 0);
  }
  return out;
}

function schemaErrors(entry, manifest) {
  try {
    new entry.model(manifest).validate();
    return [];
  } catch (err) {
    return [`schema: ${err.message}`];
  }
}

/** TypeScript diagnostics per input index: one program types every manifest against its declaration. */
function typeErrors(items, known) {
  const lines = [];
  const owner = []; // line number -> input index
  const push = (text, index) => {
    for (const line of text.split("\n")) {
      lines.push(line);
      owner.push(index);
    }
  };
  items.forEach(({ manifest }, i) => {
    const entry = known[i];
    if (entry) push(`import type { I${manifest.kind} as T${i} } from "${entry.module}";`, i);
  });
  items.forEach(({ manifest }, i) => {
    if (known[i]) push(`export const m${i}: T${i} = ${JSON.stringify(manifest, null, 1)};`, i);
  });
  const file = join(HERE, "__manifests__.ts");
  const source = lines.join("\n");
  const options = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: [],
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
  };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  const fileExists = host.fileExists.bind(host);
  host.getSourceFile = (name, lang, ...rest) =>
    name === file ? ts.createSourceFile(name, source, lang) : getSourceFile(name, lang, ...rest);
  host.fileExists = (name) => name === file || fileExists(name);
  const program = ts.createProgram([file], options, host);
  const out = items.map(() => []);
  for (const d of ts.getPreEmitDiagnostics(program, program.getSourceFile(file))) {
    const { line } = d.file.getLineAndCharacterOfPosition(d.start);
    const near = lines[line].trim();
    out[owner[line]].push(`fields: ${ts.flattenDiagnosticMessageText(d.messageText, " ")} (at ${near})`);
  }
  return out;
}

async function main() {
  let items;
  try {
    items = JSON.parse(readFileSync(0, "utf8"));
    if (!Array.isArray(items)) throw new Error("expected a JSON array");
  } catch (err) {
    process.stderr.write(`validate.mjs: stdin: ${err.message}\n`);
    process.exit(2);
  }
  const kinds = await registry();
  const known = items.map(({ manifest }) => kinds.get(`${manifest.apiVersion}/${manifest.kind}`));
  const typed = typeErrors(items, known);
  const results = items.map(({ id, manifest }, i) => {
    const entry = known[i];
    if (!entry) {
      return { id, errors: [`no upstream CRD schema for ${manifest.apiVersion} ${manifest.kind} in ${PACKAGES.join(", ")}`] };
    }
    return { id, errors: [...schemaErrors(entry, manifest), ...typed[i]] };
  });
  process.stdout.write(JSON.stringify(results));
}

await main();
