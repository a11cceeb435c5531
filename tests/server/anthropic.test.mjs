// anthropic.test.mjs — the official `@anthropic-ai/sdk` against `deltafin serve`'s /v1/messages: create and
// stream (the final message equals the streamed deltas and the non-streamed answer), every SSE frame named and
// in order, stop sequences, a forced tool call validated with ajv and its tool_result round trip (is_error,
// mixed content), thinking blocks with signatures in the history, countTokens, x-api-key and Bearer, ?beta=true
// with unknown fields, context overflow as a 400 the SDK does not retry, Claude Code's billing-header system
// block not defeating prefix reuse, pings while queued, and a client that goes away stopping its generation.
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import { BASE, KEY, check, done, sleep, post, metrics, auth } from './common.mjs';

const client = new Anthropic({ baseURL: BASE, apiKey: KEY || 'unused', maxRetries: 0, timeout: 180000 });
const model = 'claude-sonnet-4-5';   // any name: the server answers with the one model it serves
const ajv = new Ajv({ allErrors: true, strict: false });
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

// raw SSE frames of a streamed request: [{event, data}]
async function rawStream(body, headers = {}) {
  const t0 = Date.now();
  const r = await fetch(BASE + '/v1/messages', { method: 'POST', headers: auth(headers),
    body: JSON.stringify({ ...body, stream: true }) });
  const reader = r.body.getReader();
  let buf = '', firstAt = -1;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    if (firstAt < 0) firstAt = Date.now() - t0;
    buf += new TextDecoder().decode(value);
  }
  const frames = buf.split('\n\n').filter((f) => f.trim()).map((f) => {
    const ev = /^event: (.*)$/m.exec(f), data = /^data: (.*)$/m.exec(f);
    return { event: ev ? ev[1] : null, data: data ? JSON.parse(data[1]) : null, raw: f };
  });
  return { status: r.status, frames, firstAt };
}

// 1. create: system as blocks, text answer, usage
const system = [{ type: 'text', text: 'You are terse.' }, { type: 'text', text: 'Answer in one line.', cache_control: { type: 'ephemeral' } }];
const messages = [{ role: 'user', content: 'Say something nice.' }];
const m1 = await client.messages.create({ model, system, messages, max_tokens: 24, temperature: 0 });
check(m1.type === 'message' && m1.role === 'assistant' && m1.id.startsWith('msg_') && m1.content[0]?.type === 'text' &&
  textOf(m1).length > 0, 'messages.create returns an assistant message with a text block');
check(['end_turn', 'max_tokens'].includes(m1.stop_reason) && m1.usage.output_tokens >= 1 && m1.usage.output_tokens <= 24 &&
  m1.usage.input_tokens + m1.usage.cache_read_input_tokens > 10 && Number.isInteger(m1.usage.cache_read_input_tokens),
  `stop_reason and usage (${m1.stop_reason}, ${JSON.stringify(m1.usage)})`);
const m2 = await client.messages.create({ model, system, messages, max_tokens: 24, temperature: 0 });
check(textOf(m2) === textOf(m1), 'temperature 0 is deterministic');
const sysString = await client.messages.create({ model, system: 'You are terse.\nAnswer in one line.', messages,
  max_tokens: 24, temperature: 0 });
check(textOf(sysString) === textOf(m1), 'a system string equals the same text as blocks');

// 2. stream: the final message is the deltas, and equals the non-streamed answer
const stream = client.messages.stream({ model, system, messages, max_tokens: 24, temperature: 0 });
let deltas = '';
stream.on('text', (t) => { deltas += t; });
const fm = await stream.finalMessage();
check(deltas === textOf(fm) && textOf(fm) === textOf(m1) && fm.stop_reason === m1.stop_reason &&
  fm.usage.output_tokens === m1.usage.output_tokens, 'messages.stream: finalMessage equals the deltas and the non-streamed answer');

// 3. the raw stream: named frames in order, indices consistent
{
  const { status, frames } = await rawStream({ model, system, messages, max_tokens: 12, temperature: 0 });
  const names = frames.map((f) => f.event);
  const allNamed = frames.every((f) => f.event && f.data && f.data.type === f.event);
  const starts = frames.filter((f) => f.event === 'content_block_start'), stops = frames.filter((f) => f.event === 'content_block_stop');
  const deltasOk = frames.filter((f) => f.event === 'content_block_delta').every((f) => f.data.index === 0 && f.data.delta.type === 'text_delta');
  check(status === 200 && allNamed && names[0] === 'message_start' && names.at(-1) === 'message_stop' &&
    names.at(-2) === 'message_delta' && starts.length === 1 && stops.length === 1 && deltasOk &&
    frames[0].data.message.usage.input_tokens > 0 && frames.at(-2).data.usage.output_tokens === 12,
    `raw SSE: every frame has an event line matching its type, in order (${[...new Set(names)].join(',')})`);
}

// 4. stop sequences: a word of the greedy answer ends it there
{
  const base = await client.messages.create({ model, messages, max_tokens: 40, temperature: 0 });
  const words = textOf(base).split(' ').filter((w) => /^[a-z]{3,}$/.test(w));
  const stop = words[Math.floor(words.length / 2)];
  if (stop) {
    const cut = await client.messages.create({ model, messages, max_tokens: 40, temperature: 0, stop_sequences: ['zzqx', stop] });
    const at = textOf(base).indexOf(stop);
    check(cut.stop_reason === 'stop_sequence' && cut.stop_sequence === stop && textOf(cut) === textOf(base).slice(0, at),
      `stop_sequences: ends before '${stop}' with stop_reason stop_sequence`);
  } else {
    check(false, 'stop_sequences: the greedy answer has a word to stop at: ' + textOf(base));
  }
}

// 5. tools: a forced call, streamed and not, and the tool_result round trip
const weather = { type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 16 }, unit: { enum: ['c', 'f'] } },
  required: ['city', 'unit'], additionalProperties: false };
const tools = [{ name: 'get_weather', description: 'Weather for a city', input_schema: weather },
  { type: 'web_search_20250305', name: 'web_search', max_uses: 1 }];
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const t1 = await client.messages.create({ model, messages: ask, tools, tool_choice: { type: 'tool', name: 'get_weather' },
  max_tokens: 64, temperature: 1, metadata: { user_id: 'u1' } });
const use = t1.content.find((b) => b.type === 'tool_use');
check(t1.stop_reason === 'tool_use' && use && use.name === 'get_weather' && typeof use.id === 'string' && use.id.length > 0 &&
  ajv.validate(weather, use.input), `forced tool_use with input valid under its schema (${JSON.stringify(use?.input)})`);
const ts = client.messages.stream({ model, messages: ask, tools, tool_choice: { type: 'any' }, max_tokens: 64, temperature: 1 });
let partial = '';
ts.on('inputJson', (p) => { partial += p; });
const tf = await ts.finalMessage();
const suse = tf.content.find((b) => b.type === 'tool_use');
check(tf.stop_reason === 'tool_use' && suse && ajv.validate(weather, suse.input) && JSON.stringify(JSON.parse(partial)) === JSON.stringify(suse.input),
  'streamed tool_use: input_json_delta pieces make the final input');
const history = [...ask, { role: 'assistant', content: t1.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, is_error: true, content: [{ type: 'text', text: 'service down' }] },
    { type: 'text', text: 'Try again later?' }] }];
const t2 = await client.messages.create({ model, messages: history, tools, max_tokens: 16, temperature: 0 });
const c2 = await client.messages.countTokens({ model, messages: history, tools });
const c2ok = await client.messages.countTokens({ model, tools, messages: [...ask, { role: 'assistant', content: t1.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'service down' }, { type: 'text', text: 'Try again later?' }] }] });
check(t2.type === 'message' && t2.usage.input_tokens + t2.usage.cache_read_input_tokens === c2.input_tokens &&
  c2.input_tokens > c2ok.input_tokens, `tool_result round trip with is_error and mixed content (${c2.input_tokens} vs ${c2ok.input_tokens} tokens without is_error)`);

// 6. countTokens equals the prompt of the same request
const ct = await client.messages.countTokens({ model, system, messages });
check(Object.keys(ct).join() === 'input_tokens' && ct.input_tokens === m1.usage.input_tokens + m1.usage.cache_read_input_tokens,
  `countTokens returns only input_tokens, the prompt's size (${ct.input_tokens})`);

// 7. thinking blocks (with signatures) in the history are the assistant's reasoning; the bundled model does
// not reason, so the request side is what is checked: accepted, and rendered into the prompt
{
  const withThinking = [{ role: 'user', content: 'Hi' },
    { role: 'assistant', content: [{ type: 'thinking', thinking: 'The user greets me; I greet back.', signature: 'c2lnbmF0dXJl' },
      { type: 'redacted_thinking', data: 'opaque' }, { type: 'text', text: 'Hello!' }] },
    { role: 'user', content: 'How are you?' }];
  const plain = [withThinking[0], { role: 'assistant', content: 'Hello!' }, withThinking[2]];
  const r = await client.messages.create({ model, messages: withThinking, max_tokens: 8, thinking: { type: 'enabled', budget_tokens: 1024 } });
  const a = await client.messages.countTokens({ model, messages: withThinking });
  const b = await client.messages.countTokens({ model, messages: plain });
  check(r.type === 'message' && a.input_tokens >= b.input_tokens, `history with signed thinking blocks accepted (${a.input_tokens} vs ${b.input_tokens} tokens)`);
}

// 8. auth: x-api-key (the SDK's default above), Bearer, a wrong key
if (KEY) {
  const bearer = new Anthropic({ baseURL: BASE, authToken: KEY, apiKey: null, maxRetries: 0 });
  const rb = await bearer.messages.create({ model, messages, max_tokens: 2 });
  check(rb.type === 'message', 'Authorization: Bearer works too');
  let status = 0;
  try { await new Anthropic({ baseURL: BASE, apiKey: 'wrong', maxRetries: 0 }).messages.create({ model, messages, max_tokens: 2 }); }
  catch (e) { status = e.status; }
  check(status === 401, 'a wrong x-api-key → 401');
}

// 9. ?beta=true, betas and unknown fields are accepted
{
  const rb = await client.beta.messages.create({ model, messages, max_tokens: 4, betas: ['context-management-2025-06-27'],
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] }, output_config: { effort: 'high' },
    service_tier: 'auto' });
  check(rb.type === 'message', 'POST /v1/messages?beta=true with context_management, output_config and anthropic-beta');
  const raw = await post('/v1/messages?beta=true', JSON.stringify({ messages, max_tokens: 2, speed: 'fast', whatever: { a: 1 } }));
  check(raw.status === 200 && /whatever/.test(raw.headers.get('x-deltafin-ignored-fields') || ''), 'unknown fields are ignored and reported');
}

// 10. errors: context overflow is a 400 invalid_request_error (not retried), bad requests name the field
{
  let err;
  const long = 'word '.repeat(3000);
  const retrying = new Anthropic({ baseURL: BASE, apiKey: KEY || 'unused', maxRetries: 3 });
  const before = (await metrics())['deltafin_requests_total{status="400"}'] ?? 0;
  try { await retrying.messages.create({ model, messages: [{ role: 'user', content: long }], max_tokens: 8 }); } catch (e) { err = e; }
  const after = (await metrics())['deltafin_requests_total{status="400"}'] ?? 0;
  check(err && err.status === 400 && err.error?.type === 'error' && err.error?.error?.type === 'invalid_request_error' &&
    /prompt is too long/.test(err.error.error.message) && after - before === 1,
    `context overflow → one 400 invalid_request_error "prompt is too long", not retried (${after - before} requests)`);
  const bad = await post('/v1/messages', JSON.stringify({ messages: [{ role: 'system', content: 'x' }], max_tokens: 2 }));
  check(bad.status === 400 && bad.json?.type === 'error' && bad.json.error.type === 'invalid_request_error', 'a bad role → 400 in the Anthropic error shape');
  const img = await post('/v1/messages', JSON.stringify({ max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }));
  check(img.status === 400 && /text only/.test(img.json?.error?.message), 'an image block → 400 saying the model reads text only');
}

// 11. Claude Code's billing header (a system block that changes on every request) does not defeat prefix reuse
{
  const longSystem = 'You are a careful assistant who reads the whole question before answering it. '.repeat(12);
  const ask2 = (first) => client.messages.create({ model, max_tokens: 2, temperature: 0, messages,
    system: [{ type: 'text', text: first }, { type: 'text', text: longSystem }] });
  const tag = () => Math.random().toString(36).slice(2, 10);   // fresh per run: nothing cached from before
  await ask2(`x-anthropic-billing-header: cc_version=2.1.0.aaa; cc_entrypoint=cli; cch=${tag()};`);
  const b = await ask2(`x-anthropic-billing-header: cc_version=2.1.0.aaa; cc_entrypoint=cli; cch=${tag()};`);
  const other = tag();
  await ask2(`x-other-header-${other}: 1`);
  const d = await ask2(`x-other-header-${other}: 2`);
  const total = b.usage.input_tokens + b.usage.cache_read_input_tokens;
  // reused from the slot or the prompt cache: at least the system prompt (the cache keeps what precedes the
  // last user message)
  check(total > 150 && b.usage.cache_read_input_tokens >= 0.8 * total && d.usage.cache_read_input_tokens < 20,
    `billing-header block dropped: ${b.usage.cache_read_input_tokens} of ${total} prompt tokens reused (another varying first line: ${d.usage.cache_read_input_tokens})`);
}

// 12. a stream queued behind long generations: message_start at once, then pings until its answer
{
  const slots = (await (await fetch(BASE + '/props', { headers: auth() })).json()).total_slots;
  const long = Promise.all(Array.from({ length: slots }, () =>
    post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 300, temperature: 0 }))));
  await sleep(50);
  const { status, frames, firstAt } = await rawStream({ messages, max_tokens: 3 });
  await long;
  const firstBlock = frames.findIndex((f) => f.event === 'content_block_start' || f.event === 'message_delta');
  const pings = frames.slice(0, firstBlock).filter((f) => f.event === 'ping').length;
  check(status === 200 && frames[0].event === 'message_start' && firstAt < 1000 && pings >= 2 && frames.at(-1).event === 'message_stop',
    `queued stream: message_start after ${firstAt} ms, ${pings} pings before the answer, then message_stop`);
}

// 13. a client that goes away stops its generation
{
  const m0 = await metrics();
  const ac = new AbortController();
  try {
    const s = await client.messages.create({ model, messages, max_tokens: 400, stream: true }, { signal: ac.signal });
    let n = 0;
    for await (const ev of s) if (ev.type === 'content_block_delta' && ++n >= 5) ac.abort();
  } catch { /* aborted */ }
  await sleep(500);
  const m1 = await metrics();
  check(m1.deltafin_requests_cancelled_total === m0.deltafin_requests_cancelled_total + 1 && m1.deltafin_requests_running === 0,
    'an aborted messages stream cancels its generation');
}

done();
