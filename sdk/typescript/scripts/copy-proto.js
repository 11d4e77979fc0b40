// Build step: copies idemraft.proto, the wire contract the client loads at run time, from the
// repository's proto package into the build output, so an installed package carries it.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const outDir = process.argv[2];
if (!outDir) {
  console.error("usage: node scripts/copy-proto.js <output directory>");
  process.exit(2);
}
const root = path.resolve(__dirname, "..");
const source = path.resolve(root, "..", "..", "proto", "proto", "idemraft", "v1", "idemraft.proto");
const target = path.resolve(root, outDir, "proto", "idemraft", "v1", "idemraft.proto");
if (!fs.existsSync(source)) {
  console.error(`copy-proto: ${path.relative(root, source)} not found; build from a checkout of the Idemraft repository`);
  process.exit(1);
}
fs.mkdirSync(path.dirname(target), { recursive: true });
fs.copyFileSync(source, target);
