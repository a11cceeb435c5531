// slots.test.mjs — conversation slots and the connection guards, against a server started with
// --parallel 2 --queue 2 --read-timeout 2 --max-conns-per-client 8 --alias gpt-4o-mini --cors
// http://allowed.example (DELTAFIN_URL) and one with --parallel 1 --queue 0 (DELTAFIN_URL0):
// concurrent streaming chats answer exactly as one at a time, a disconnect frees its slot, the queue and
// 429s under load and churn, half-closed clients, slow clients, huge requests, n > 1, /tokenize,
// /detokenize, /props, lenient payloads, aliases, CORS and Origin.
import net from 'node:net';
import fs from 'node:fs';
import OpenAI from 'openai';
import { BASE, KEY, check, done, sleep, post, metrics, auth } from './common.mjs';

const B0 = process.env.DELTAFIN_URL0;
const pid = process.env.DELTAFIN_PID;
const client = new OpenAI({ baseURL: BASE + '/v1', apiKey: KEY || 'unused', maxRetries: 0, timeout: 60000 });
const model = 'gpt-4o-mini';   // any name is served; this one is also the alias

// raw HTTP over a socket: optional half-close after sending, optional local address
function rawHttp(base, method, path, body, { halfClose = false, localAddress, headers = {} } = {}) {
  return new Promise((resolve) => {
    const u = new URL(base);
    const sock = net.connect({ host: u.hostname, port: Number(u.port), localAddress });
    let data = '';
    sock.on('data', (d) => { data += d; });
    // A server refusing a large body early answers and closes while the client is still sending: the write
    // fails (EPIPE, reset), and the answer may still be read before the socket closes. So an error is noted and
    // the result given at close, with the status of whatever answer arrived.
    let error;
    sock.on('error', (e) => { error = e.message; });
    sock.on('close', () => resolve({ data, error, status: Number((/HTTP\/1\.1 ([2-5]\d\d)/.exec(data) || [])[1] || 0) }));
    sock.on('connect', () => {
      const h = { Host: u.host, 'Content-Type': 'application/json', Connection: 'close', ...headers };
      if (KEY) h.Authorization = 'Bearer ' + KEY;
      if (body) h['Content-Length'] = Buffer.byteLength(body);
      sock.write(`${method} ${path} HTTP/1.1\r\n` + Object.entries(h).map(([k, v]) => `${k}: ${v}\r\n`).join('') +
        '\r\n' + (body || ''));
      if (halfClose) sock.end();   // shutdown(SHUT_WR): still reading the answer
    });
  });
}

async function streamChat(content, max_tokens = 40) {
  const s = await client.chat.completions.create({ model, messages: [{ role: 'user', content }], max_tokens,
    temperature: 0, stream: true });
  let text = '', finish = null;
  for await (const ch of s) {
    text += ch.choices[0]?.delta?.content ?? '';
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish };
}

// 1. concurrent streaming chats answer exactly as when sent one at a time (temperature 0)
const prompts = ['Tell me about rivers.', 'What is a boat?', 'Count to five.', 'Name a colour.'];
const alone = [];
for (const p of prompts) alone.push(await streamChat(p));
const together = await Promise.all(prompts.map((p) => streamChat(p)));
check(together.every((r, i) => r.text === alone[i].text && r.finish === alone[i].finish && r.text.length > 0),
  `${prompts.length} concurrent streaming chats (2 slots + queue) give the same text as one at a time`);

// 2. a disconnect mid-stream frees its slot at once
const m0 = await metrics();
const ac = new AbortController();
const long = await client.completions.create({ model, prompt: [1, 20, 30], max_tokens: 400, temperature: 0,
  stream: true }, { signal: ac.signal });
let seen = 0;
try { for await (const ch of long) { if (++seen >= 3) ac.abort(); } } catch { /* aborted */ }
let m1 = await metrics();
for (let i = 0; i < 50 && m1.deltafin_requests_running !== 0; i++) { await sleep(20); m1 = await metrics(); }
check(m1.deltafin_requests_running === 0 && m1.deltafin_requests_cancelled_total === m0.deltafin_requests_cancelled_total + 1,
  'a client that disconnects mid-stream frees its slot');

// 3. n > 1 shares the prompt's prefill: n answers, the first equal to n = 1 with the same seed
const one = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0.9,
  seed: 5 });
const two = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0.9,
  seed: 5, n: 2 });
check(two.choices.length === 2 && two.choices[0].text === one.choices[0].text && two.choices[1].index === 1 &&
  two.usage.completion_tokens >= 2, 'n = 2: two answers, the first as with n = 1');
const m2 = await metrics();
check(m2.deltafin_prompt_tokens_total - m1.deltafin_prompt_tokens_total <= 2 * one.usage.prompt_tokens,
  'n = 2 prefills its prompt once');

// 3b. an answer cut by the full context ends with "length" and a note saying so
const full = await client.completions.create({ model, prompt: Array(500).fill(9), max_tokens: 100, temperature: 0 });
check(full.choices[0].finish_reason === 'length' && full.usage.completion_tokens === 12 && /context is full/.test(full.note),
  `context full: finish_reason "length" with a note (${full.note})`);

// 4. /tokenize, /detokenize and /props as llama-server has them
const tk = await post('/tokenize', JSON.stringify({ content: 'hello world' }));
const dt = await post('/detokenize', JSON.stringify({ tokens: tk.json?.tokens }));
check(tk.status === 200 && Array.isArray(tk.json.tokens) && tk.json.tokens.length >= 2 && dt.json?.content === 'hello world',
  '/tokenize and /detokenize round-trip');
const tp = await post('/tokenize', JSON.stringify({ content: 'hi', with_pieces: true }));
check(tp.json?.tokens?.every((t) => Number.isInteger(t.id) && typeof t.piece === 'string'), '/tokenize with_pieces');
const bad = await post('/detokenize', JSON.stringify({ tokens: [1, -5] }));
check(bad.status === 400, '/detokenize refuses ids outside the vocabulary');
const props = await (await fetch(BASE + '/props', { headers: auth() })).json();
check(props.total_slots === 2 && props.n_ctx > 0 && props.slots.length === 2, '/props lists the context and the slots');

// 5. lenient payloads as popular clients send them; aliases; strict mode is tested on the --strict server
const lenient = await post('/v1/chat/completions', JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user',
  content: 'hi', name: null }], max_tokens: 3, store: false, metadata: { a: 'b' }, n: null, stop: null, user: null,
  logit_bias: {}, frequency_penalty: null, stream_options: null, service_tier: 'auto', some_new_field: 1 }));
check(lenient.status === 200 && lenient.headers.get('x-deltafin-ignored-fields') === 'some_new_field',
  `lenient: null and no-op values are absent, unknown fields ignored and listed (got ${lenient.status} ${lenient.headers.get('x-deltafin-ignored-fields')})`);
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === 'gpt-4o-mini', '--alias sets what /v1/models lists');

// 6. Origin: another site's page is refused; --cors origins get CORS headers and a preflight answer
let r = await post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 1 }), { headers: { Origin: 'http://evil.example' } });
check(r.status === 403 && r.json?.error?.code === 'origin_not_allowed', 'a request from another site is refused (403)');
r = await post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 1 }), { headers: { Origin: 'http://allowed.example' } });
check(r.status === 200 && r.headers.get('access-control-allow-origin') === 'http://allowed.example',
  '--cors origin is served with Access-Control-Allow-Origin');
const pre = await fetch(BASE + '/v1/chat/completions', { method: 'OPTIONS', headers: { Origin: 'http://allowed.example',
  'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization,content-type' } });
check(pre.status === 204 && /POST/.test(pre.headers.get('access-control-allow-methods')) &&
  /Authorization/i.test(pre.headers.get('access-control-allow-headers')), 'CORS preflight is answered');
const u = new URL(BASE);
r = await post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 1 }), { headers: { Origin: `http://${u.host}` } });
check(r.status === 200, 'the page\'s own origin is served');
if (KEY) {
  r = await rawHttp(BASE, 'GET', '/v1/models', null, { headers: { Authorization: 'bearer   ' + KEY } });
  check(r.status === 200, 'the Bearer scheme is matched case-insensitively');
}

// 7. a client that half-closes after its request (shutdown(SHUT_WR)) still gets its answer, streamed or not
const hc = await rawHttp(BASE, 'POST', '/v1/completions', JSON.stringify({ prompt: 'abc', max_tokens: 20 }), { halfClose: true });
const hcs = await rawHttp(BASE, 'POST', '/v1/completions', JSON.stringify({ prompt: 'abc', max_tokens: 20, stream: true }),
  { halfClose: true });
check(hc.status === 200 && /"text_completion"/.test(hc.data) && hcs.status === 200 && hcs.data.includes('data: [DONE]'),
  `half-closed clients get their answer (${hc.status}, ${hcs.status})`);

// 8. queue and 429 under load: 2 slots + 2 waiting; the fifth concurrent request is refused, the rest succeed
{
  const go = () => client.completions.create({ model, prompt: [1, 2, 3], max_tokens: 150, temperature: 0 })
    .then(() => 200, (e) => e.status);
  const first = [go(), go(), go(), go()];
  let m = await metrics();
  for (let i = 0; i < 100 && !(m.deltafin_requests_running === 2 && m.deltafin_queue_depth === 2); i++) {
    await sleep(10); m = await metrics();
  }
  const fifth = await go();
  const rest = await Promise.all(first);
  check(fifth === 429 && rest.every((x) => x === 200), `full queue → 429, the running and queued succeed (${fifth}, ${rest})`);
}

// 9. churn: clients that give up while queued leave at once; nobody else gets a 429 while there is room
{
  const m = await metrics();
  const results = [];
  for (let round = 0; round < 10; round++) {
    const keep = [1, 2].map(() => client.completions.create({ model, prompt: [1, 5, 9], max_tokens: 30, temperature: 0 })
      .then(() => 'ok', (e) => String(e.status)));
    const quit = [1, 2].map(async () => {
      const c = new AbortController();
      const p = fetch(BASE + '/v1/completions', { method: 'POST', headers: auth(), signal: c.signal,
        body: JSON.stringify({ prompt: [1, 5, 9], max_tokens: 30 }) }).catch(() => null);
      await sleep(5);
      c.abort();
      await p;
    });
    await Promise.all(quit);
    await sleep(30);   // the server notices a closed connection at once, not before it is closed
    const late = client.completions.create({ model, prompt: [2, 6], max_tokens: 3, temperature: 0 })
      .then(() => 'ok', (e) => String(e.status));
    results.push(...await Promise.all([...keep, late]));
  }
  const bad = results.filter((x) => x !== 'ok');
  check(bad.length === 0, `churn: 30 requests among 20 that gave up, all answered (${bad.join(',') || 'none refused'})`);
  const after = await metrics();
  check(after.deltafin_queue_depth === 0 && after.deltafin_requests_running === 0, 'churn: queue and slots drain');
}

// 10. --queue 0: no waiting; 429 only while the slot is busy
if (B0) {
  const go = (n) => fetch(B0 + '/v1/completions', { method: 'POST', headers: auth(),
    body: JSON.stringify({ prompt: 'z', max_tokens: n, temperature: 0 }) });
  const idle = await go(2);
  const first = go(300);
  let m = await metrics(B0);
  for (let i = 0; i < 100 && m.deltafin_requests_running !== 1; i++) { await sleep(10); m = await metrics(B0); }
  const second = await go(2);
  check(idle.status === 200 && second.status === 429 && (await first).status === 200,
    `--queue 0: served when idle, 429 when busy (${idle.status}, ${second.status})`);
}

// 10b. slot state counts against --slot-mem (DELTAFIN_URLM: --parallel 2 --slot-mem 1700K, room for one
// 512-token conversation beside an empty slot): two long requests run one after the other though a slot is free
const BM = process.env.DELTAFIN_URLM;
if (BM) {
  const go = () => fetch(BM + '/v1/completions', { method: 'POST', headers: auth(),
    body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 400, temperature: 0 }) });
  const before = await metrics(BM);
  const both = [go(), go()];
  let maxRunning = 0, settled = false;
  Promise.all(both).then(() => { settled = true; });
  while (!settled) {
    const m = await metrics(BM);
    maxRunning = Math.max(maxRunning, m.deltafin_requests_running);
    await sleep(15);
  }
  const st = (await Promise.all(both)).map((x) => x.status);
  const waited = (await metrics(BM)).deltafin_requests_waited_for_memory_total -
    before.deltafin_requests_waited_for_memory_total;
  check(maxRunning === 1 && waited === 1 && st.every((x) => x === 200),
    `slot memory: the second long conversation waits instead of overrunning it (max running ${maxRunning}, waited ${waited}, ${st})`);
  const big = await fetch(BM + '/v1/completions', { method: 'POST', headers: auth(),
    body: JSON.stringify({ prompt: Array(480).fill(5), max_tokens: 20 }) });
  check(big.status === 200, 'a prompt near the context still fits one slot');
}

// 11. a huge request of token ids is refused before it is parsed, with bounded memory
{
  const rss = () => pid ? Number(/VmHWM:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) : 0;
  const before = rss();
  const ids = '[' + Array(4 << 20).fill('7').join(',') + ']';   // ~8 MiB, 4M values
  const t0 = Date.now();
  const rs = await Promise.all([0, 1, 2, 3].map(() => rawHttp(BASE, 'POST', '/v1/completions', `{"prompt":${ids}}`)));
  const ms = Date.now() - t0;
  const grew = rss() - before;
  // Each is refused once its first megabytes are counted; when the server closes while the client is still
  // writing, the kernel may reset the connection before the client reads the 400: a refusal all the same.
  const refused = (x) => (x.status === 400 && x.data.includes('context_length_exceeded')) ||
    (!x.status && /EPIPE|ECONNRESET/.test(x.error || ''));
  check(rs.every(refused) && rs.some((x) => x.status === 400),
    `a prompt of 4M token ids is refused as over the context (${rs.map((x) => x.status || x.error).join(', ')})`);
  check(!pid || grew < 200 * 1024, `four such requests at once raise peak memory by ${grew} kB (< 200 MB), in ${ms} ms`);
  const text = await rawHttp(BASE, 'POST', '/v1/completions', JSON.stringify({ prompt: 'word '.repeat(3 << 20) }));
  check(text.status === 400 && text.data.includes('context_length_exceeded'),
    'a 15 MiB text prompt is refused before it is tokenised');
}

// 12. slow clients (a header byte every second, from another address) neither lock others out nor stay
// past the read timeout
{
  const slow = [];
  for (let i = 0; i < 12; i++) {
    const s = net.connect({ host: u.hostname, port: Number(u.port), localAddress: '127.0.0.2' });
    s.on('error', () => {});
    slow.push(s);
  }
  const header = 'GET /health HTTP/1.1\r\nX-Slow: ' + 'a'.repeat(100);
  let k = 0;
  const drip = setInterval(() => { for (const s of slow) if (!s.destroyed) s.write(header[k % header.length]); k++; }, 1000);
  await sleep(500);
  const h = await fetch(BASE + '/health');
  const c = await client.completions.create({ model, prompt: 'hi', max_tokens: 3 });
  check(h.status === 200 && c.choices.length === 1, '/health and a completion answer while slow clients drip headers');
  const refused = slow.filter((s) => s.destroyed || s.readyState !== 'open').length;
  await sleep(3500);
  clearInterval(drip);
  const closed = slow.filter((s) => s.destroyed || s.readyState !== 'open' || s.readableEnded).length;
  const m = await metrics();
  check(closed === slow.length && m.deltafin_connections_timed_out_total >= 8,
    `slow clients: ${refused} refused over the per-client limit, all closed after the read timeout (${closed}/12, ${m.deltafin_connections_timed_out_total} timed out)`);
  for (const s of slow) s.destroy();
}
done();
