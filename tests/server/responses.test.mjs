// responses.test.mjs — the official `openai` package's `client.responses` against `deltafin serve`'s stateless
// /v1/responses: create and stream (the whole event chain in order, sequence numbers, final response equal to
// the non-streamed one), function tools (forced, streamed argument deltas, ajv-valid), a custom tool answered
// as a custom_tool_call with raw input, hosted tools ignored, text.format json_schema, every input item kind
// in a multi-turn history, previous_response_id refused, Codex's empty probe, and in_progress keepalives.
import OpenAI from 'openai';
import Ajv from 'ajv';
import { BASE, KEY, check, done, sleep, post, auth } from './common.mjs';

const client = new OpenAI({ baseURL: BASE + '/v1', apiKey: KEY || 'unused', maxRetries: 0, timeout: 180000 });
const model = (await client.models.list()).data[0].id;
const ajv = new Ajv({ allErrors: true, strict: false });

async function rawEvents(body) {
  const t0 = Date.now();
  const r = await fetch(BASE + '/v1/responses', { method: 'POST', headers: auth(), body: JSON.stringify({ ...body, stream: true }) });
  const reader = r.body.getReader();
  let buf = '', firstAt = -1;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    if (firstAt < 0) firstAt = Date.now() - t0;
    buf += new TextDecoder().decode(value);
  }
  const events = buf.split('\n\n').filter((f) => f.trim() && !f.startsWith(':')).map((f) => {
    const ev = /^event: (.*)$/m.exec(f), data = /^data: (.*)$/m.exec(f);
    return { event: ev?.[1], data: data ? JSON.parse(data[1]) : null };
  });
  return { status: r.status, events, firstAt };
}

// 1. create
const r1 = await client.responses.create({ model, instructions: 'You are terse.', input: 'Say something nice.',
  max_output_tokens: 24, temperature: 0, store: false });
check(r1.object === 'response' && r1.id.startsWith('resp_') && r1.output.length === 1 && r1.output[0].type === 'message' &&
  r1.output[0].id.startsWith('msg_') && typeof r1.output_text === 'string' && r1.output_text.length > 0,
  'responses.create returns a message with output_text');
check(r1.usage.input_tokens > 5 && r1.usage.output_tokens >= 1 && r1.usage.output_tokens <= 24 &&
  r1.usage.total_tokens === r1.usage.input_tokens + r1.usage.output_tokens && ['completed', 'incomplete'].includes(r1.status) &&
  (r1.status === 'completed' || r1.incomplete_details.reason === 'max_output_tokens'),
  `usage and status (${r1.status}, ${JSON.stringify(r1.usage)})`);
const r1b = await client.responses.create({ model, instructions: 'You are terse.',
  input: [{ role: 'user', content: [{ type: 'input_text', text: 'Say something nice.' }] }], max_output_tokens: 24, temperature: 0 });
check(r1b.output_text === r1.output_text, 'input as items equals input as a string (temperature 0)');

// 2. stream: the event chain, sequence numbers, and the final response
{
  const s = client.responses.stream({ model, instructions: 'You are terse.', input: 'Say something nice.', max_output_tokens: 24, temperature: 0 });
  const types = [], seqs = [];
  let deltas = '';
  for await (const ev of s) {
    types.push(ev.type);
    seqs.push(ev.sequence_number);
    if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  }
  const fin = await s.finalResponse();
  const order = ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added',
    'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.completed'];
  const firsts = order.map((t) => types.indexOf(t));
  check(firsts.every((x, i) => x >= 0 && (i === 0 || x > firsts[i - 1])) && types[0] === 'response.created' &&
    types.at(-1) === 'response.completed', `stream: the whole event chain in order (${[...new Set(types)].join(', ')})`);
  check(seqs.every((n, i) => n === i), 'stream: sequence_number counts every event from 0');
  check(deltas === r1.output_text && fin.output_text === r1.output_text && fin.usage.output_tokens === r1.usage.output_tokens,
    'stream: the deltas and finalResponse equal the non-streamed answer');
}

// 3. function tools: forced, plain and streamed
const weather = { type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 16 }, unit: { enum: ['c', 'f'] } },
  required: ['city', 'unit'], additionalProperties: false };
const applyPatch = { type: 'custom', name: 'apply_patch', description: 'Edit files with a patch.',
  format: { type: 'grammar', syntax: 'lark', definition: 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?' } };
const tools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city', parameters: weather, strict: true },
  applyPatch, { type: 'web_search' }, { type: 'image_generation' }];
{
  const r = await client.responses.create({ model, input: 'Weather in Paris?', tools, tool_choice: 'required', max_output_tokens: 64 });
  const calls = r.output.filter((o) => o.type === 'function_call' || o.type === 'custom_tool_call');
  const fc = r.output.find((o) => o.type === 'function_call');
  check(calls.length >= 1 && (!fc || (fc.id.startsWith('fc_') && fc.call_id && fc.name === 'get_weather' && ajv.validate(weather, JSON.parse(fc.arguments)))),
    `tool_choice required: a tool call (${calls.map((c) => c.type).join(',')}), hosted tools ignored`);
  const named = await client.responses.create({ model, input: 'Weather in Paris?', tools,
    tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 64 });
  const nf = named.output.find((o) => o.type === 'function_call');
  check(nf && nf.name === 'get_weather' && ajv.validate(weather, JSON.parse(nf.arguments)) && named.status === 'completed',
    `named function: arguments valid under the schema (${JSON.stringify(nf?.arguments)})`);
  const s = client.responses.stream({ model, input: 'Weather in Paris?', tools, tool_choice: { type: 'function', name: 'get_weather' },
    max_output_tokens: 64, temperature: 0 });
  let args = '', doneArgs = null;
  for await (const ev of s) {
    if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    if (ev.type === 'response.function_call_arguments.done') doneArgs = ev.arguments;
  }
  const fin = await s.finalResponse();
  const sf = fin.output.find((o) => o.type === 'function_call');
  check(sf && args === doneArgs && doneArgs === sf.arguments && ajv.validate(weather, JSON.parse(sf.arguments)),
    'streamed function call: argument deltas add up to the done event and the final item');
}

// 4. a custom tool (Codex's freeform apply_patch) comes back as a custom_tool_call with raw input
{
  const r = await client.responses.create({ model, input: 'Fix the bug.', tools, tool_choice: { type: 'custom', name: 'apply_patch' },
    max_output_tokens: 48 });
  const ct = r.output.find((o) => o.type === 'custom_tool_call');
  check(ct && ct.name === 'apply_patch' && typeof ct.input === 'string' && ct.call_id && !r.output.some((o) => o.type === 'function_call'),
    `custom tool: a custom_tool_call with raw text input (${JSON.stringify(ct?.input)})`);
  const { events } = await rawEvents({ model, input: 'Fix the bug.', tools, tool_choice: { type: 'custom', name: 'apply_patch' },
    max_output_tokens: 48, temperature: 0 });
  const deltas = events.filter((e) => e.event === 'response.custom_tool_call_input.delta').map((e) => e.data.delta).join('');
  const dn = events.find((e) => e.event === 'response.custom_tool_call_input.done');
  const item = events.find((e) => e.event === 'response.output_item.done' && e.data.item.type === 'custom_tool_call');
  check(dn && deltas === dn.data.input && item.data.item.input === dn.data.input && events.at(-1).event === 'response.completed' &&
    events.every((e) => e.data.type === e.event), 'streamed custom tool: input deltas, done, item done, completed');
}

// 5. text.format json_schema
{
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'], additionalProperties: false };
  const r = await client.responses.create({ model, input: 'A person as JSON.', max_output_tokens: 80,
    text: { format: { type: 'json_schema', name: 'person', schema, strict: true } } });
  let v;
  try { v = JSON.parse(r.output_text); } catch { v = undefined; }
  check(v !== undefined && ajv.validate(schema, v), `text.format json_schema: output valid under the schema (${JSON.stringify(r.output_text)})`);
}

// 6. a multi-turn history with every item kind is rendered (each adds to the prompt)
{
  const base = [{ type: 'message', role: 'developer', content: 'Be brief.' }, { role: 'user', content: 'Weather in Paris?' }];
  const turn = [
    { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'Look it up.' }], encrypted_content: null },
    { type: 'function_call', id: 'fc_1', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '21 C and sunny' },
    { type: 'custom_tool_call', id: 'ctc_1', call_id: 'call_2', name: 'apply_patch', input: '*** Begin Patch\n*** End Patch\n' },
    { type: 'custom_tool_call_output', call_id: 'call_2', output: 'Done!' },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'It is sunny.' }] },
    { role: 'user', content: 'Thanks.' },
  ];
  const small = [tools[0], { type: 'custom', name: 'apply_patch' }];   // the context is 512 tokens
  const a = await client.responses.create({ model, input: base, tools: small, max_output_tokens: 4 });
  const b = await client.responses.create({ model, input: [...base, ...turn], tools: small, max_output_tokens: 4 });
  check(a.status !== 'failed' && b.usage.input_tokens > a.usage.input_tokens + 30,
    `history with function_call(_output), custom_tool_call(_output), reasoning and developer items (${a.usage.input_tokens} → ${b.usage.input_tokens} tokens)`);
}

// 7. stateless: previous_response_id is refused clearly; Codex's empty probe answers
{
  let err;
  try { await client.responses.create({ model, input: 'hi', previous_response_id: r1.id }); } catch (e) { err = e; }
  check(err && err.status === 400 && /previous_response_id/.test(err.message), 'previous_response_id → 400 naming it');
  const probe = await client.responses.create({ model, input: [], max_output_tokens: 1 });
  check(probe.object === 'response' && probe.usage.output_tokens === 1, 'an empty input with max_output_tokens 1 answers');
  const img = await post('/v1/responses', JSON.stringify({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:,' }] }] }));
  check(img.status === 400 && /text only/.test(img.json?.error?.message), 'an input_image part → 400 saying the model reads text only');
}

// 8. a stream queued behind long generations: response.created at once, then response.in_progress until output
{
  const slots = (await (await fetch(BASE + '/props', { headers: auth() })).json()).total_slots;
  const long = Promise.all(Array.from({ length: slots }, () =>
    post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 300, temperature: 0 }))));
  await sleep(50);
  const { status, events, firstAt } = await rawEvents({ model, input: 'hi', max_output_tokens: 3 });
  await long;
  const firstItem = events.findIndex((e) => e.event === 'response.output_item.added');
  const progress = events.slice(0, firstItem).filter((e) => e.event === 'response.in_progress').length;
  check(status === 200 && events[0].event === 'response.created' && firstAt < 1000 && progress >= 3 &&
    events.at(-1).event === 'response.completed' && events.every((e, i) => e.data.sequence_number === i),
    `queued stream: response.created after ${firstAt} ms, ${progress} response.in_progress before output, then completed`);
}

done();
