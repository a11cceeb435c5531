// tools.test.mjs — tool calls with the official `openai` package: required, named and parallel tool calls
// (plain and streamed), tool_choice none, a conversation carrying tool calls and results. Every argument
// string is parsed and validated with ajv; the bundled model knows no chat, so only the grammar (which
// generates forced calls) can make these pass. JSON answers are in json_schema.test.mjs.
import OpenAI from 'openai';
import Ajv from 'ajv';
import { BASE, KEY, check, done, post } from './common.mjs';

const client = new OpenAI({ baseURL: BASE + '/v1', apiKey: KEY || 'unused', maxRetries: 0, timeout: 120000 });
const model = (await client.models.list()).data[0].id;
const ajv = new Ajv({ allErrors: true, strict: false });
const valid = (schema, value) => {
  const ok = ajv.validate(schema, value);
  if (!ok) console.log('# ajv: ' + ajv.errorsText() + ' in ' + JSON.stringify(value));
  return ok;
};
const parse = (s) => { try { return JSON.parse(s); } catch { return undefined; } };

// small schemas: the bundled model has a 512-token context and the tools are part of the prompt
const weather = {
  type: 'object',
  properties: { city: { type: 'string', minLength: 1, maxLength: 16 }, unit: { enum: ['c', 'f'] },
    days: { type: 'integer', minimum: 1, maximum: 7 } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const search = {
  type: 'object',
  properties: { q: { type: 'string', maxLength: 16 }, n: { type: 'integer', minimum: 1, maximum: 9 } },
  required: ['q', 'n'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', parameters: weather } },
  { type: 'function', function: { name: 'search', parameters: search } },
];
const schemaOf = { get_weather: weather, search };
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

function callsValid(calls, allowed) {
  return Array.isArray(calls) && calls.length >= 1 && calls.every((c) => c.type === 'function' &&
    typeof c.id === 'string' && c.id.length > 0 && allowed.includes(c.function.name) &&
    valid(schemaOf[c.function.name], parse(c.function.arguments)));
}

// required: several seeds at temperature 1, each answer a valid call
let okRequired = 0;
const seeds = [1, 2];
for (const seed of seeds) {
  const r = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens: 64,
    temperature: 1, seed });
  const ch = r.choices[0];
  if (ch.finish_reason === 'tool_calls' && ch.message.content === null &&
      callsValid(ch.message.tool_calls, ['get_weather', 'search'])) okRequired++;
  else console.log('# required: ' + JSON.stringify(ch));
}
check(okRequired === seeds.length, `tool_choice required: ${okRequired}/${seeds.length} answers are tool calls with valid arguments`);

// named: the chosen function, one call
let okNamed = 0;
for (const seed of [5]) {
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 64, temperature: 1, seed,
    tool_choice: { type: 'function', function: { name: 'search' } } });
  const calls = r.choices[0].message.tool_calls;
  if (callsValid(calls, ['search']) && calls.length === 1) okNamed++;
}
check(okNamed === 1, 'tool_choice naming a function: one call of that function with valid arguments');

const single = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required',
  parallel_tool_calls: false, max_tokens: 64, temperature: 1, seed: 9 });
check(single.choices[0].message.tool_calls?.length === 1 && callsValid(single.choices[0].message.tool_calls,
  ['get_weather', 'search']), 'parallel_tool_calls false: exactly one call');

// streaming: deltas accumulate into the same calls as the non-streamed answer
const plain = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens: 64,
  temperature: 0 });
const stream = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens: 64,
  temperature: 0, stream: true });
const acc = [];
let finish = null, firstHasHead = true, sawDelta = 0;
for await (const chunk of stream) {
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.finish_reason) finish = c.finish_reason;
  for (const d of c.delta?.tool_calls ?? []) {
    sawDelta++;
    if (!acc[d.index]) {
      acc[d.index] = { id: d.id, type: d.type, function: { name: d.function?.name, arguments: '' } };
      if (!d.id || !d.function?.name) firstHasHead = false;
    }
    acc[d.index].function.arguments += d.function?.arguments ?? '';
  }
}
check(finish === 'tool_calls' && firstHasHead && sawDelta >= 2 && callsValid(acc, ['get_weather', 'search']),
  `streamed tool calls: id and name first, then argument deltas (${sawDelta} deltas), finish_reason tool_calls`);
check(JSON.stringify(acc) === JSON.stringify(plain.choices[0].message.tool_calls),
  'streamed tool calls equal the non-streamed ones');

// the openai helper's own accumulation of a streamed call
const runner = client.chat.completions.stream({ model, messages, tools, tool_choice: 'required', max_tokens: 64,
  temperature: 0 });
const fc = await runner.finalChatCompletion();
check(JSON.stringify(fc.choices[0].message.tool_calls?.map((c) => [c.id, c.function.name, c.function.arguments])) ===
  JSON.stringify(plain.choices[0].message.tool_calls.map((c) => [c.id, c.function.name, c.function.arguments])),
  'openai stream helper assembles the same tool calls');

// a conversation that carries the call and its result is rendered (the tool turns take prompt tokens)
const call = plain.choices[0].message.tool_calls[0];
const turn = [...messages, { role: 'assistant', content: null, tool_calls: [call] },
  { role: 'tool', tool_call_id: call.id, content: '{"temp":21}' }];
const withTools = await client.chat.completions.create({ model, messages: turn, tools: tools.slice(0, 1), max_tokens: 4,
  temperature: 0 });
const without = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0 });
check(withTools.usage.prompt_tokens > without.usage.prompt_tokens + 40 && typeof withTools.choices[0].finish_reason === 'string',
  `tools, an assistant tool call and a tool result are accepted and rendered (${withTools.usage.prompt_tokens} vs ${without.usage.prompt_tokens} prompt tokens)`);

// tool_choice none: no call comes back
let noCall = 0;
for (const seed of [11]) {
  const r = await client.chat.completions.create({ model, messages, tools, tool_choice: 'none', max_tokens: 24,
    temperature: 1, seed });
  if (!r.choices[0].message.tool_calls && r.choices[0].finish_reason !== 'tool_calls') noCall++;
}
check(noCall === 1, 'tool_choice none: plain answers');

// refusals name the field
const badChoice = await post('/v1/chat/completions', JSON.stringify({ model, messages, tools,
  tool_choice: { type: 'function', function: { name: 'nope' } } }));
check(badChoice.status === 400 && badChoice.json?.error?.param === 'tool_choice', 'unknown named tool: 400 tool_choice');
const noTools = await post('/v1/chat/completions', JSON.stringify({ model, messages, tool_choice: 'required' }));
check(noTools.status === 400 && noTools.json?.error?.param === 'tool_choice', 'tool_choice required without tools: 400');

done();
