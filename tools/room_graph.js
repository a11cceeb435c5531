// room_graph.js — the rooms of src/ and the includes between them, drawn from the code itself: reads src/ROOMS
// and every quoted #include of src/*/*.[ch] (resolved like the compiler: the file's folder, then src/), and the
// calls of the public engine API (df_engine_*, df_session_*, df_batch_*) made from other rooms, which reach
// src/engine through include/deltafin.h and so show in no include.
//   node tools/room_graph.js --svg FILE    writes the picture as SVG (docs/rooms.svg)
//   node tools/room_graph.js --mermaid     prints the same graph as a mermaid block (docs/ARCHITECTURE.md)
// tests/shell/test_layout.sh checks that both committed copies are what this draws today.
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.join(__dirname, "..");
const src = path.join(root, "src");
const order = fs.readFileSync(path.join(src, "ROOMS"), "utf8").split("\n")
  .map((l) => l.trim()).filter((l) => l && !l.startsWith("#")).map((l) => l.split(/\s+/)[0]);

const edges = new Map();   // "a b" -> include count
const calls = new Set();   // rooms that call the engine through the public header
for (const room of order) {
  const dir = path.join(src, room);
  for (const f of fs.readdirSync(dir).filter((n) => /\.[ch]$/.test(n)).sort()) {
    const text = fs.readFileSync(path.join(dir, f), "utf8");
    for (const m of text.matchAll(/^\s*#\s*include\s*"([^"]+)"/gm)) {
      let target = null;
      if (fs.existsSync(path.join(dir, m[1]))) target = path.relative(src, path.join(dir, m[1]));
      else if (fs.existsSync(path.join(src, m[1]))) target = m[1];
      if (!target || !target.includes("/")) continue;
      const to = target.split("/")[0];
      if (to === room) continue;
      edges.set(`${room} ${to}`, (edges.get(`${room} ${to}`) || 0) + 1);
    }
    if (room !== "engine" && f.endsWith(".c") && /\bdf_(engine|session|batch)_[a-z_]+\s*\(/.test(text)) calls.add(room);
  }
}

// Level: 0 for a room that includes no other, else one above the highest room it includes or calls.
const level = {};
const deps = (r) => [...edges.keys()].filter((k) => k.startsWith(r + " ")).map((k) => k.split(" ")[1])
  .concat(calls.has(r) ? ["engine"] : []);
for (const r of order) level[r] = Math.max(-1, ...deps(r).map((d) => level[d] ?? 0)) + 1;
const rows = [];
for (const r of order) (rows[level[r]] = rows[level[r]] || []).push(r);

function svg() {
  const W = 150, H = 40, GX = 40, GY = 70, M = 30;
  const width = Math.max(...rows.map((r) => r.length)) * (W + GX) - GX + 2 * M;
  const height = rows.length * (H + GY) - GY + 2 * M + 60;
  const pos = {};
  rows.forEach((row, lv) => {
    const y = M + (rows.length - 1 - lv) * (H + GY);
    const x0 = (width - (row.length * (W + GX) - GX)) / 2;
    row.forEach((r, i) => (pos[r] = { x: x0 + i * (W + GX), y }));
  });
  const out = [`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" ` +
    `viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="14">`,
    `<defs><marker id="a" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="9" markerHeight="9" ` +
    `markerUnits="userSpaceOnUse" orient="auto">` +
    `<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>`,
    `<rect width="100%" height="100%" fill="white"/>`];
  const line = (a, b, dashed, n) => {
    const p = pos[a], q = pos[b];
    // ports spread along the box edges by where the other end lies, so parallel edges do not coincide
    const spread = (dx) => Math.max(-0.4, Math.min(0.4, dx / width * 1.6)) * W;
    const x1 = p.x + W / 2 + spread(q.x - p.x), y1 = p.y + H, x2 = q.x + W / 2 + spread(p.x - q.x), y2 = q.y;
    const my = (y1 + y2) / 2;
    out.push(`<path d="M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}" fill="none" stroke="#555" ` +
      `stroke-opacity="0.55" stroke-width="${dashed ? 1.5 : Math.min(1 + Math.log2(n), 4).toFixed(1)}"` +
      `${dashed ? ' stroke-dasharray="5,4"' : ""} marker-end="url(#a)"><title>${a} → ${b}` +
      `${dashed ? " (calls the public API)" : ` (${n} include${n > 1 ? "s" : ""})`}</title></path>`);
  };
  for (const [k, n] of [...edges.entries()].sort()) if (!k.endsWith(" common")) line(...k.split(" "), false, n);
  for (const r of [...calls].sort()) if (!edges.has(`${r} engine`)) line(r, "engine", true, 1);
  for (const r of order) {
    const p = pos[r], w = r === "common" ? width - 2 * M : W, x = r === "common" ? M : p.x;
    if (r === "common") p.x = M + (w - W) / 2;
    out.push(`<rect x="${x}" y="${p.y}" width="${w}" height="${H}" rx="6" fill="#eef3fb" stroke="#3a5f9e"/>`,
      `<text x="${p.x + W / 2}" y="${p.y + H / 2 + 5}" text-anchor="middle">${r}</text>`);
  }
  out.push(`<text x="${M}" y="${height - 46}" font-size="12" fill="#333">Arrows: includes between rooms ` +
    `(thicker: more of them). Every room uses common.</text>`,
    `<text x="${M}" y="${height - 30}" font-size="12" fill="#333">Dashed: calls of the engine's df_* API ` +
    `through include/deltafin.h.</text>`,
    `<text x="${M}" y="${height - 14}" font-size="12" fill="#333">Drawn by tools/room_graph.js from src/ROOMS and ` +
    `the includes of src/ (test_layout.sh checks it is current).</text>`,
    "</svg>");
  return out.join("\n") + "\n";
}

function mermaid() {
  const out = ["```mermaid", "flowchart TD"];
  for (const [k] of [...edges.entries()].sort()) out.push(`  ${k.split(" ").join(" --> ")}`);
  for (const r of [...calls].sort()) if (!edges.has(`${r} engine`)) out.push(`  ${r} -.->|deltafin.h| engine`);
  out.push("```");
  return out.join("\n") + "\n";
}

const args = process.argv.slice(2);
if (args[0] === "--svg" && args[1]) fs.writeFileSync(args[1], svg());
else if (args[0] === "--mermaid") process.stdout.write(mermaid());
else {
  process.stderr.write("usage: node tools/room_graph.js --svg FILE | --mermaid\n");
  process.exit(2);
}
