// ollama.test.mjs — ollama's API through the real `ollama` npm client (ollama-js): version, list, show (the
// context length under "<arch>.context_length", capabilities), ps, chat and generate (streamed and not, the
// text equal to the OpenAI route's at temperature 0), options (num_predict, stop, seed), format "json" and a
// schema (validated with ajv), tool calls in ollama's shape and a tool round trip; NDJSON keepalive lines while
// a request waits behind running generations (the server runs --keepalive 0.3); GET / and HEAD / as ollama;
// llama.cpp's POST /completion as Continue sends it; /v1/models, /api/tags and /health answering quickly
// while generations run; a client that disconnects stopping its generation.
import { Ollama } from 'ollama';
import Ajv from 'ajv';
import { BASE, KEY, check, done, sleep, post, metrics, auth } from './common.mjs';

const ollama = new Ollama({ host: BASE, headers: KEY ? { Authorization: 'Bearer ' + KEY } : {} });
const info = (await (await fetch(BASE + '/v1/models', { headers: auth() })).json()).data[0];
const ajv = new Ajv({ strict: false });
const openaiChat = async (messages, extra = {}) =>
  (await post('/v1/chat/completions', JSON.stringify({ messages, temperature: 0, ...extra }))).json;

// ---- the model ----
const v = await ollama.version();
check(/^\d+\.\d+\.\d+$/.test(v.version), `version ${v.version}`);
const list = await ollama.list();
const name = list.models[0]?.name;
check(list.models.length === 1 && name === info.id + ':latest' && list.models[0].size > 0 &&
  /^[0-9a-f]{64}$/.test(list.models[0].digest) && typeof list.models[0].details.family === 'string' &&
  !isNaN(Date.parse(list.models[0].modified_at)), `list names the served model (${name})`);
const show = await ollama.show({ model: name });
const arch = show.model_info['general.architecture'];
check(show.model_info[arch + '.context_length'] === info.context_length && show.capabilities.includes('completion') &&
  show.capabilities.includes('tools') && /num_ctx\s+\d+/.test(show.parameters) && !show.template.includes('.Suffix'),
  `show: ${arch}.context_length = ${show.model_info[arch + '.context_length']}, capabilities ${show.capabilities}`);
let err = null;
try { await ollama.show({ model: 'no-such-model' }); } catch (e) { err = e; }
check(err?.status_code === 404 && /not found/.test(err.message), 'show of an unknown model → 404 with ollama\'s error');
const ps = await ollama.ps();
check(ps.models.length === 1 && ps.models[0].context_length === info.context_length, 'ps lists the loaded model');

// ---- chat and generate ----
const messages = [{ role: 'user', content: 'Say something nice.' }];
const opts = { num_predict: 12, temperature: 0 };
const ref = await openaiChat(messages, { max_tokens: 12 });
const c1 = await ollama.chat({ model: name, messages, options: opts });
check(c1.done === true && c1.message.role === 'assistant' && c1.message.content === ref.choices[0].message.content,
  'chat (stream:false) equals the OpenAI route at temperature 0');
check(c1.done_reason === (ref.choices[0].finish_reason === 'length' ? 'length' : 'stop') &&
  c1.eval_count === ref.usage.completion_tokens && c1.prompt_eval_count === ref.usage.prompt_tokens &&
  c1.total_duration > 0 && c1.eval_duration > 0 && c1.total_duration >= c1.eval_duration && c1.model === name,
  `chat counts and times (done_reason ${c1.done_reason}, eval_count ${c1.eval_count}, total ${c1.total_duration} ns)`);
const parts = [];
for await (const p of await ollama.chat({ model: name, messages, options: opts, stream: true })) parts.push(p);
const last = parts[parts.length - 1];
check(parts.map((p) => p.message.content).join('') === c1.message.content && last.done &&
  last.eval_count === c1.eval_count && parts.slice(0, -1).every((p) => p.done === false && !isNaN(Date.parse(p.created_at))),
  `streamed chat (${parts.length} lines) equals the whole answer`);

const g1 = await ollama.generate({ model: name, prompt: messages[0].content, options: opts });
check(g1.done && g1.response === c1.message.content, 'generate applies the chat format: same answer as chat');
let gs = '';
for await (const p of await ollama.generate({ model: name, prompt: messages[0].content, options: opts, stream: true }))
  gs += p.response;
check(gs === g1.response, 'streamed generate equals the whole answer');
const rawRef = (await post('/v1/completions', JSON.stringify({ prompt: 'Once upon a time', max_tokens: 12,
  temperature: 0 }))).json;
const g2 = await ollama.generate({ model: name, prompt: 'Once upon a time', raw: true, options: opts });
check(g2.response === rawRef.choices[0].text, 'generate raw:true equals /v1/completions');
const load = await ollama.generate({ model: name, prompt: '' });
check(load.done && load.done_reason === 'load' && load.response === '', 'generate with an empty prompt answers "load"');

// stop: the answer ends before the first occurrence of a stop string taken from the unstopped answer
const long = await ollama.generate({ model: name, prompt: 'Once upon a time', raw: true,
  options: { num_predict: 30, temperature: 0 } });
const stopAt = long.response.slice(8, 11);
const stopped = await ollama.generate({ model: name, prompt: 'Once upon a time', raw: true,
  options: { num_predict: 30, temperature: 0, stop: [stopAt] } });
check(stopAt.length === 3 && stopped.response === long.response.slice(0, long.response.indexOf(stopAt)) &&
  stopped.done_reason === 'stop', `options.stop cuts the answer at ${JSON.stringify(stopAt)}`);
const seeded = async (seed) => (await ollama.chat({ model: name, messages,
  options: { num_predict: 16, temperature: 1, seed } })).message.content;
const s1 = await seeded(5), s2 = await seeded(5), s3 = await seeded(6);
check(s1 === s2 && s1 !== s3, 'options.seed: same seed same sample, another seed another');

// format
// "json" is the OpenAI route's json_object: the same seed gives the same answer
const fj = await ollama.chat({ model: name, messages, format: 'json', options: { num_predict: 40, seed: 9 } });
const fjRef = await openaiChat(messages, { response_format: { type: 'json_object' }, max_tokens: 40, seed: 9,
  temperature: 1 });
check(fj.message.content === fjRef.choices[0].message.content && fj.message.content.trimStart().startsWith('{'),
  `format "json" constrains as json_object does (${fj.message.content.slice(0, 40)})`);
const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer',
  minimum: 0, maximum: 120 } }, required: ['name', 'age'], additionalProperties: false };
const fs = await ollama.chat({ model: name, messages, format: schema, options: { num_predict: 60, seed: 3 } });
let fsv;
try { fsv = JSON.parse(fs.message.content); } catch { fsv = undefined; }
check(fsv !== undefined && ajv.validate(schema, fsv), `format with a schema gives valid JSON (${JSON.stringify(fsv)})`);

// tools: ollama's shape (arguments as an object); the bundled model knows no chat, so the call is forced with
// Deltafin's tool_choice extension
const weather = { type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 12 } },
  required: ['city'], additionalProperties: false };
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: weather } }];
const t1 = await ollama.chat({ model: name, messages, tools, tool_choice: 'required', options: { num_predict: 60 } });
const call = t1.message.tool_calls?.[0];
check(t1.message.tool_calls?.length >= 1 && call.function.name === 'get_weather' &&
  typeof call.function.arguments === 'object' && ajv.validate(weather, call.function.arguments),
  `chat with tools returns ollama tool_calls (${JSON.stringify(call?.function)})`);
const streamedCalls = [];
for await (const p of await ollama.chat({ model: name, messages, tools, tool_choice: 'required', stream: true,
  options: { num_predict: 60 } }))
  streamedCalls.push(...(p.message.tool_calls ?? []));
check(streamedCalls.length >= 1 && streamedCalls.every((c) => c.function.name === 'get_weather' &&
  ajv.validate(weather, c.function.arguments)), `streamed chat carries whole tool calls (${streamedCalls.length})`);
const round = await ollama.chat({ model: name, tools, options: { num_predict: 6 }, messages: [...messages,
  { role: 'assistant', content: '', tool_calls: [{ function: { name: 'get_weather', arguments: { city: 'Paris' } } }] },
  { role: 'tool', content: 'sunny, 21 C', tool_name: 'get_weather' }] });
check(round.done && round.prompt_eval_count > t1.prompt_eval_count, 'a conversation with a tool call and its result');
const thinkOff = await ollama.chat({ model: name, messages, think: false, options: { num_predict: 4 } });
check(thinkOff.done && thinkOff.message.thinking === undefined, 'think: false is accepted');

// errors in ollama's shape
err = null;
try { await ollama.chat({ model: name, messages: [{ role: 'user', content: 'x', images: ['aGk='] }] }); } catch (e) { err = e; }
check(err?.status_code === 400 && /text only/.test(err.message), `images → 400 (${err?.message})`);
err = null;
try { await ollama.chat({ model: name, messages: [{ role: 'user', content: 'x '.repeat(4000) }] }); } catch (e) { err = e; }
check(err?.status_code === 400 && /context/.test(err.message), `a prompt over the context → 400 (${err?.message})`);
err = null;
try { await ollama.generate({ model: name, prompt: 'x', options: { num_predict: 0 } }); } catch (e) { err = e; }
check(err?.status_code === 400 && /num_predict/.test(err.message), 'num_predict 0 → 400 naming it');

// ---- the root, as ollama answers it ----
let r = await fetch(BASE + '/');
check(r.status === 200 && (await r.text()) === 'Ollama is running', 'GET / without text/html: "Ollama is running"');
r = await fetch(BASE + '/', { headers: { Accept: 'text/html,application/xhtml+xml' } });
check(r.status === 200 && (await r.text()).includes('<html'), 'GET / from a browser: the chat page');
r = await fetch(BASE + '/', { method: 'HEAD' });
check(r.status === 200 && (await r.text()) === '', 'HEAD / → 200');

// ---- llama.cpp's /completion, as Continue sends it ----
const cbody = { prompt: 'Once upon a time', n_predict: 12, temperature: 0, stream: true, cache_prompt: true };
r = await fetch(BASE + '/completion', { method: 'POST', headers: auth(), body: JSON.stringify(cbody) });
const sse = await r.text();
const events = sse.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => JSON.parse(e.slice(6)));
const fin = events[events.length - 1];
check(r.headers.get('content-type') === 'text/event-stream' && events.slice(0, -1).every((e) => e.stop === false) &&
  fin.stop === true && fin.tokens_predicted === rawRef.usage.completion_tokens && fin.timings.predicted_n === fin.tokens_predicted &&
  events.map((e) => e.content).join('') === rawRef.choices[0].text && !sse.includes('[DONE]'),
  `/completion streams SSE content pieces and a final stop event (${events.length} events)`);
const cids = (await post('/tokenize', JSON.stringify({ content: 'Once upon a time' }))).json.tokens;
const cnon = (await post('/completion', JSON.stringify({ prompt: cids, n_predict: 12, temperature: 0 }))).json;
check(cnon.content === rawRef.choices[0].text && cnon.stop === true && cnon.tokens_evaluated === cids.length &&
  ['limit', 'eos'].includes(cnon.stop_type), '/completion from token ids, not streamed: the same text');
const cbad = await post('/completion', JSON.stringify({ prompt: 'x', n_predict: 0 }));
check(cbad.status === 400 && /n_predict/.test(cbad.json?.error?.message), '/completion n_predict 0 → 400');

// ---- keepalives while queued: both slots busy, an NDJSON stream still starts at once ----
const slots = (await (await fetch(BASE + '/props', { headers: auth() })).json()).total_slots;
const busy = Array.from({ length: slots }, () =>
  post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 400, temperature: 0 })));
await sleep(100);
// the routes clients poll answer while every slot generates
const lat = {};
for (const path of ['/v1/models', '/api/tags', '/health']) {
  const ms = [];
  for (let i = 0; i < 3; i++) {
    const t0 = performance.now();
    const x = await fetch(BASE + path, { headers: auth() });
    await x.text();
    ms.push(x.status === 200 ? performance.now() - t0 : 1e9);
  }
  lat[path] = ms.sort((a, b) => a - b)[1];
}
check(Object.values(lat).every((ms) => ms < 100), `models, tags and health answer during generation (median ms ${JSON.stringify(lat, (k, x) => typeof x === 'number' ? Math.round(x) : x)})`);
const t0 = performance.now();
r = await fetch(BASE + '/api/chat', { method: 'POST', headers: auth(), body: JSON.stringify({ model: name,
  messages, options: { num_predict: 3 } }) });
const reader = r.body.getReader();
const first = await reader.read();
const firstMs = performance.now() - t0;
let ndjson = new TextDecoder().decode(first.value);
for (;;) { const x = await reader.read(); if (x.done) break; ndjson += new TextDecoder().decode(x.value); }
const lines = ndjson.trim().split('\n').map((l) => JSON.parse(l));
const waits = lines.filter((l) => l.prompt_progress);
check(r.headers.get('content-type') === 'application/x-ndjson' && firstMs < 1000 && lines[0].done === false,
  `a queued NDJSON stream sends its first line at once (${Math.round(firstMs)} ms)`);
const progress = waits.map((l) => l.prompt_progress);
check(waits.length >= 1 && waits.every((l) => l.done === false && l.message.content === '') &&
  progress.some((p) => p.queued === true) && lines[lines.length - 1].done === true &&
  progress.every((p, i) => p.total === lines[lines.length - 1].prompt_eval_count && p.processed <= p.total &&
    (i === 0 || p.processed >= progress[i - 1].processed)),
  `keepalive lines while queued (${waits.length}), then the answer`);
// ollama-js takes those lines as empty pieces
const busy2 = Array.from({ length: slots }, () =>
  post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 400, temperature: 0 })));
await Promise.all(busy);
await sleep(100);
let pieces = 0, text = '', final = null;
for await (const p of await ollama.chat({ model: name, messages, options: opts, stream: true })) {
  pieces++;
  text += p.message.content;
  if (p.done) final = p;
}
await Promise.all(busy2);
check(final && text === c1.message.content && pieces > parts.length,
  `ollama-js reads a queued stream with keepalives to the same answer (${pieces} lines)`);

// ---- a client that disconnects stops its generation ----
const m0 = await metrics();
let seen = 0;
const it = await ollama.chat({ model: name, messages, stream: true, options: { num_predict: 3000 } });
try {
  for await (const p of it) if (p.message.content && ++seen >= 3) it.abort();
} catch { /* aborted */ }
let m1 = await metrics();
for (let i = 0; i < 40 && m1.deltafin_requests_running > 0; i++) { await sleep(50); m1 = await metrics(); }
check(m1.deltafin_requests_cancelled_total === m0.deltafin_requests_cancelled_total + 1 &&
  m1.deltafin_generated_tokens_total - m0.deltafin_generated_tokens_total < 3000,
  `a disconnected ollama stream stops (${m1.deltafin_generated_tokens_total - m0.deltafin_generated_tokens_total} of 3000 tokens)`);
done();
