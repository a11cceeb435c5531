// openai.test.mjs — the official `openai` package against `deltafin serve`: models, chat, chat streaming,
// completions, determinism and seeds, stop strings, logprobs, errors, abort mid-stream, queueing behind a
// running generation, and conversation-state reuse.
import OpenAI from 'openai';
import { BASE, KEY, check, done, sleep, post, metrics, auth } from './common.mjs';

const client = new OpenAI({ baseURL: BASE + '/v1', apiKey: KEY || 'unused', maxRetries: 0, timeout: 60000 });
const models = await client.models.list();
const model = models.data[0]?.id;
check(models.data.length === 1 && typeof model === 'string' && models.data[0].owned_by === 'deltafin',
  'models.list returns the served model');
const one = await client.models.retrieve(model);
check(one.id === model, 'models.retrieve by id');

const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something nice.' }];
const c1 = await client.chat.completions.create({ model, messages: msgs, max_tokens: 24, temperature: 0 });
const text1 = c1.choices[0].message.content;
check(c1.object === 'chat.completion' && typeof text1 === 'string' && c1.choices[0].message.role === 'assistant',
  'chat completion returns an assistant message');
check(['stop', 'length'].includes(c1.choices[0].finish_reason) && c1.usage.completion_tokens >= 1 &&
  c1.usage.completion_tokens <= 24 && c1.usage.total_tokens === c1.usage.prompt_tokens + c1.usage.completion_tokens,
  'chat finish_reason and usage');
const c2 = await client.chat.completions.create({ model, messages: msgs, max_tokens: 24, temperature: 0 });
check(c2.choices[0].message.content === text1, 'temperature 0 is deterministic');

const seeded = async (seed) => (await client.chat.completions.create({ model, messages: msgs, max_tokens: 24,
  temperature: 1, top_p: 0.95, top_k: 50, seed })).choices[0].message.content;
const s1 = await seeded(42), s2 = await seeded(42), s3 = await seeded(7);
check(s1 === s2, 'same seed, same sample');
check(s1 !== s3, 'different seed, different sample');

// streaming: role chunk first, content deltas, finish chunk, usage chunk; the text equals the non-stream one
const stream = await client.chat.completions.create({ model, messages: msgs, max_tokens: 24, temperature: 0,
  stream: true, stream_options: { include_usage: true } });
const chunks = [];
for await (const ch of stream) chunks.push(ch);
const streamed = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
check(chunks[0].choices[0].delta.role === 'assistant', 'stream starts with the assistant role');
const fin = chunks.filter((c) => c.choices[0]?.finish_reason);
check(fin.length === 1 && fin[0].choices[0].finish_reason === c1.choices[0].finish_reason, 'one final chunk with finish_reason');
const last = chunks[chunks.length - 1];
check(last.choices.length === 0 && last.usage && last.usage.completion_tokens === c1.usage.completion_tokens,
  'usage chunk last when include_usage');
check(streamed === text1, 'streamed text equals the non-streamed text');

// completions: text and token-array prompts, logprobs
const k1 = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
check(k1.object === 'text_completion' && typeof k1.choices[0].text === 'string' && k1.usage.completion_tokens >= 1,
  'completion from a text prompt');
const k2 = await client.completions.create({ model, prompt: [1, 20, 30, 40], max_tokens: 8, temperature: 0,
  logprobs: 3 });
const lp = k2.choices[0].logprobs;
check(lp && lp.tokens.length === k2.usage.completion_tokens && lp.token_logprobs.every((x) => x <= 0) &&
  lp.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 3),
  'completion from token ids with logprobs');
const kstream = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16,
  temperature: 0, stream: true });
let ktext = '';
for await (const ch of kstream) ktext += ch.choices[0]?.text ?? '';
check(ktext === k1.choices[0].text, 'streamed completion equals the non-streamed one');

// stop strings are matched on text and never emitted
const base = k1.choices[0].text;
const cut = [...base].slice(3, 5).join('');
if (cut.length) {
  const ks = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16, temperature: 0,
    stop: [cut, 'zzzz'] });
  check(ks.choices[0].text === base.slice(0, base.indexOf(cut)) && ks.choices[0].finish_reason === 'stop',
    'stop string cuts the text before it');
} else check(false, 'completion text too short for the stop test');

const cl = await client.chat.completions.create({ model, messages: msgs, max_tokens: 4, temperature: 0,
  logprobs: true, top_logprobs: 2 });
const lc = cl.choices[0].logprobs?.content;
check(Array.isArray(lc) && lc.length === cl.usage.completion_tokens && lc.every((e) => e.top_logprobs.length === 2 &&
  Array.isArray(e.bytes)), 'chat logprobs with top_logprobs');

// errors through the SDK
try {
  await client.chat.completions.create({ model, messages: msgs, functions: [{ name: 'f' }] });
  check(false, 'unknown field is refused');
} catch (e) {
  check(e.status === 400 && e.param === 'functions', 'unknown field is refused with 400 naming it');
}
try {
  await client.chat.completions.create({ model: 'gpt-4o', messages: msgs });
  check(false, 'wrong model is refused');
} catch (e) { check(e.status === 404, 'wrong model is refused with 404'); }
if (KEY) {
  const bad = new OpenAI({ baseURL: BASE + '/v1', apiKey: 'wrong', maxRetries: 0 });
  try { await bad.models.list(); check(false, 'wrong API key refused'); } catch (e) {
    check(e.status === 401, 'wrong API key gets 401');
  }
  const h = await fetch(BASE + '/health');
  check(h.status === 200, '/health needs no key');
}

// abort mid-stream: the generation stops, the server keeps serving
const m0 = await metrics();
const ac = new AbortController();
// (a completion from token ids: the fixture model never emits the end token there, so it runs to max_tokens)
const long = await client.completions.create({ model, prompt: [1, 20, 30], max_tokens: 3000, temperature: 0,
  stream: true }, { signal: ac.signal });
let seen = 0;
try {
  for await (const ch of long) { if (++seen >= 5) ac.abort(); }
} catch (e) { /* aborted */ }
await sleep(500);
const m1 = await metrics();
check(m1.deltafin_requests_cancelled_total === m0.deltafin_requests_cancelled_total + 1,
  'abort mid-stream cancels the generation');
check(m1.deltafin_generated_tokens_total - m0.deltafin_generated_tokens_total < 3000 && m1.deltafin_requests_running === 0,
  `aborted generation stopped early (${m1.deltafin_generated_tokens_total - m0.deltafin_generated_tokens_total} of 3000 tokens)`);

// concurrent requests queue (FIFO) and all succeed; /health, /v1/models and /metrics answer meanwhile
const t0 = Date.now();
const jobs = [0, 1, 2, 3].map((i) => client.chat.completions.create({ model, messages: msgs, max_tokens: 400,
  temperature: 0.8, seed: i }).then((r) => ({ r, t: Date.now() - t0 })));
await sleep(30);
const during = await metrics();
const h = await fetch(BASE + '/health');
const ml = await client.models.list();
check(h.status === 200 && ml.data.length === 1 && during.deltafin_requests_running === 1 &&
  during.deltafin_queue_depth >= 1, `health/models/metrics answer during generation (queue depth ${during.deltafin_queue_depth})`);
const results = await Promise.all(jobs);
check(results.every(({ r }) => r.choices[0].message.content !== undefined && r.usage.completion_tokens >= 1),
  'four concurrent requests all succeed');

// a queued client that disconnects leaves the queue at once
const blocker = client.completions.create({ model, prompt: [1, 20, 30], max_tokens: 1000, temperature: 0 });
await sleep(30);
const qac = new AbortController();
const queued = fetch(BASE + '/v1/chat/completions', { method: 'POST', headers: auth(), signal: qac.signal,
  body: JSON.stringify({ model, messages: msgs, max_tokens: 5 }) }).catch(() => null);
await sleep(100);
const q1 = (await metrics()).deltafin_queue_depth;
qac.abort();
await queued;
await sleep(300);
const q2 = (await metrics()).deltafin_queue_depth;
check(q1 === 1 && q2 === 0, `queued client that disconnects is dropped (queue ${q1} → ${q2})`);
await blocker;

// conversation reuse: a prompt that extends the previous one only prefills the new tokens
const r0 = (await metrics()).deltafin_prompt_tokens_reused_total;
const p = [1, 20, 30, 40, 50, 60, 70, 80];
const a1 = await client.completions.create({ model, prompt: p, max_tokens: 1, temperature: 0 });
const a2 = await client.completions.create({ model, prompt: [...p, 90, 100], max_tokens: 1, temperature: 0 });
const r1 = (await metrics()).deltafin_prompt_tokens_reused_total;
check(r1 - r0 === p.length && a2.usage.prompt_tokens_details?.cached_tokens === p.length,
  `extending the previous prompt reuses its state (${r1 - r0} tokens)`);
const fresh = await post('/v1/completions', JSON.stringify({ model, prompt: [...p, 90, 100], max_tokens: 1,
  temperature: 0 }));
check(fresh.json?.choices?.[0]?.text === a2.choices[0].text, 'reused state gives the same answer as a fresh prefill');
done();
