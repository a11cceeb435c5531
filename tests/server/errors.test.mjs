// errors.test.mjs — bad input never crashes or hangs the server: malformed JSON, wrong types, huge bodies,
// over-long prompts, invalid UTF-8, missing key, unknown routes, wrong methods; SSE keep-alives while a
// request waits; 429 + Retry-After only when the queue (DELTAFIN_URL2: a server with --queue 1) is full.
import http from 'node:http';
import { BASE, KEY, check, done, sleep, post, metrics, auth } from './common.mjs';

const info = (await (await fetch(BASE + '/v1/models', { headers: auth() })).json()).data[0];

const chat = (extra) => JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...extra });
const cases = [
  ['malformed JSON', '/v1/chat/completions', '{"messages": [', 400, 'invalid_json'],
  ['body that is not an object', '/v1/chat/completions', '"hello"', 400, 'invalid_value'],
  ['messages of the wrong type', '/v1/chat/completions', '{"messages": 5}', 400, 'invalid_type'],
  ['max_tokens of the wrong type', '/v1/chat/completions', chat({ max_tokens: 'ten' }), 400, 'invalid_type'],
  ['n = 99', '/v1/chat/completions', chat({ n: 99 }), 400, 'invalid_value'],
  ['image content part', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user',
    content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, null],
  ['prompt longer than the context', '/v1/completions', JSON.stringify({ prompt: Array(info.context_length + 1).fill(7) }), 400,
    'context_length_exceeded'],
  ['token id outside the vocabulary', '/v1/completions', JSON.stringify({ prompt: [1, 2 ** 30] }), 400, 'invalid_value'],
  ['empty body', '/v1/completions', '', 400, 'invalid_json'],
];
for (const [name, path, body, status, code] of cases) {
  const r = await post(path, body);
  check(r.status === status && r.json?.error?.message && (code === null || r.json.error.code === code),
    `${name} → ${status} ${code ?? ''} (got ${r.status} ${r.json?.error?.code})`);
}

// raw requests: invalid UTF-8, chunked oversize body, no key
function raw(method, path, { body, headers = {}, chunked = false } = {}) {
  return new Promise((resolve) => {
    const u = new URL(BASE + path);
    const req = http.request({ host: u.hostname, port: u.port, method, path, headers: { ...auth(), ...headers } },
      (res) => {
        let t = '';
        res.on('data', (d) => { t += d; });
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text: t }));
      });
    req.on('error', (e) => resolve({ status: 0, error: e.message }));
    if (body && chunked) {
      const piece = Buffer.alloc(1 << 20, 0x20);
      let sent = 0;
      const pump = () => {
        while (sent < body) {
          sent += piece.length;
          if (!req.write(piece)) { req.once('drain', pump); return; }
        }
        req.end();
      };
      pump();
    } else {
      if (body) req.write(body);
      req.end();
    }
  });
}
const badUtf8 = Buffer.concat([Buffer.from('{"prompt":"a'), Buffer.from([0xff, 0xc3]), Buffer.from('"}')]);
let r = await raw('POST', '/v1/completions', { body: badUtf8 });
check(r.status === 400, `invalid UTF-8 → 400 (got ${r.status})`);
r = await raw('POST', '/v1/completions', { body: Buffer.alloc(17 << 20, 0x20) });
check(r.status === 413 || r.status === 0, `17 MiB body with Content-Length → 413 (got ${r.status} ${r.error ?? ''})`);
r = await raw('POST', '/v1/completions', { body: 17 << 20, chunked: true });
check(r.status === 413, `17 MiB chunked body → 413 (got ${r.status} ${r.error ?? ''})`);
r = await raw('GET', '/v1/nothing');
check(r.status === 404 && JSON.parse(r.text).error.code === 'not_found', 'unknown route → 404');
r = await raw('GET', '/v1/chat/completions');
check(r.status === 405 && r.headers.allow === 'POST', 'GET on a POST route → 405 with Allow');
r = await raw('DELETE', '/health');
check(r.status === 405, 'DELETE /health → 405');
if (KEY) {
  r = await raw('GET', '/v1/models', { headers: { Authorization: 'Bearer nope' } });
  check(r.status === 401 && JSON.parse(r.text).error.code === 'invalid_api_key', 'wrong API key → 401');
  r = await raw('POST', '/v1/completions', { body: '{"prompt":"x"}', headers: { Authorization: '' } });
  check(r.status === 401, 'missing API key → 401');
}
r = await raw('GET', '/metrics');
check(r.status === 200 && /deltafin_requests_total\{status="400"\} \d+/.test(r.text) &&
  /deltafin_requests_total\{status="413"\}/.test(r.text), 'metrics count requests by status');

// a streaming request queued behind long generations gets SSE keep-alive comments (server runs --keepalive 0.3)
const slots = (await (await fetch(BASE + '/props', { headers: auth() })).json()).total_slots;
const long = Promise.all(Array.from({ length: slots }, () =>
  post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 300, temperature: 0 }))));
await sleep(30);
const q = await fetch(BASE + '/v1/completions', { method: 'POST', headers: auth(),
  body: JSON.stringify({ prompt: 'y', max_tokens: 3, stream: true }) });
const qt = await q.text();
await long;
check(q.status === 200 && qt.includes(': keep-alive') && qt.trimEnd().endsWith('data: [DONE]'),
  'queued stream receives keep-alive comments, then its answer');

// 429 + Retry-After only when the queue is full
const B2 = process.env.DELTAFIN_URL2;
if (B2) {
  const go = (n) => fetch(B2 + '/v1/completions', { method: 'POST', headers: auth(),
    body: JSON.stringify({ prompt: 'z', max_tokens: n, temperature: 0 }) });
  const first = go(3000);
  let running = 0;
  for (let i = 0; i < 50 && !running; i++) { await sleep(10); running = (await metrics(B2)).deltafin_requests_running; }
  const second = go(3);
  await sleep(50);
  const third = await go(3);
  const body3 = await third.json();
  check(third.status === 429 && third.headers.get('retry-after') === '1' && body3.error.type === 'rate_limit_error',
    `full queue → 429 with Retry-After (got ${third.status})`);
  const [a, b] = await Promise.all([first, second]);
  check(a.status === 200 && b.status === 200, 'the running and the queued request both succeed');
}

const h = await fetch(BASE + '/health');
check(h.status === 200, 'server healthy after the bad input');
done();
