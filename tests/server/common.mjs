// common.mjs — the TAP-like protocol of tests/run.sh ("ok - " / "not ok - ") and small HTTP helpers.
export const BASE = process.env.DELTAFIN_URL;            // e.g. http://127.0.0.1:8123
export const KEY = process.env.DELTAFIN_KEY || '';
let failures = 0;

export function check(cond, name) {
  if (cond) console.log('ok - ' + name);
  else { failures++; console.log('not ok - ' + name); }
}

export function done() { process.exit(failures ? 1 : 0); }

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function auth(extra = {}) {
  return { 'Content-Type': 'application/json', ...(KEY ? { Authorization: 'Bearer ' + KEY } : {}), ...extra };
}

export async function post(path, body, opts = {}) {
  const r = await fetch(BASE + path, { method: 'POST', headers: auth(opts.headers), body, signal: opts.signal });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

export async function metrics(base = BASE) {
  const r = await fetch(base + '/metrics', { headers: auth() });
  const t = await r.text();
  const m = {};
  for (const line of t.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}
