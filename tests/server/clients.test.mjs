// clients.test.mjs — Chat Completions as other real clients drive it: the AI SDK (`ai` streamText through
// `@ai-sdk/openai-compatible` with tools and includeUsage), LangChain (`@langchain/openai` bindTools + stream,
// the aggregated call's name equal to the real one), and the fields clients send or need, over plain fetch:
// the developer role, max_completion_tokens, `reasoning` as well as `reasoning_content` in the history,
// parallel_tool_calls false (at most one call), logprobs and top_logprobs while streaming, usage in the last
// chunk, and context overflow as a clear 400. The bundled model knows no chat, so tool calls are forced
// (tool choice "required"): only the grammar makes them valid.
import { streamText, tool, jsonSchema } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import Ajv from 'ajv';
import { BASE, KEY, check, done, post, auth } from './common.mjs';

const info = (await (await fetch(BASE + '/v1/models', { headers: auth() })).json()).data[0];
const model = info.id;
const ajv = new Ajv({ strict: false });
const weather = { type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 12 },
  unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false };
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const chat = async (extra) => post('/v1/chat/completions', JSON.stringify({ model, messages, ...extra }));

// ---- AI SDK ----
{
  const provider = createOpenAICompatible({ name: 'deltafin', baseURL: BASE + '/v1', apiKey: KEY || 'unused',
    includeUsage: true });
  const errors = [];
  const result = streamText({
    model: provider.chatModel(model),
    messages,
    tools: { get_weather: tool({ description: 'Weather of a city', inputSchema: jsonSchema(weather) }) },
    toolChoice: 'required',
    maxOutputTokens: 80,
    onError: ({ error }) => errors.push(error),
  });
  const kinds = new Set();
  for await (const part of result.fullStream) kinds.add(part.type);
  const calls = await result.toolCalls;
  const usage = await result.usage;
  check(errors.length === 0 && !kinds.has('error'), `AI SDK streamText: no error (${errors.map(String).join('; ')})`);
  check(calls.length >= 1 && calls.every((c) => c.toolName === 'get_weather' && ajv.validate(weather, c.input)) &&
    kinds.has('tool-input-start') && kinds.has('tool-input-delta'),
    `AI SDK streamText: streamed tool calls valid against the schema (${JSON.stringify(calls[0]?.input)})`);
  check(usage.inputTokens > 0 && usage.outputTokens > 0 && usage.totalTokens === usage.inputTokens + usage.outputTokens,
    `AI SDK streamText: usage from the stream (${usage.inputTokens} in, ${usage.outputTokens} out)`);
  const plain = streamText({ model: provider.chatModel(model), prompt: 'Say hi.', maxOutputTokens: 8 });
  let text = '';
  for await (const t of plain.textStream) text += t;
  const pu = await plain.usage;
  check(text.length > 0 && pu.outputTokens === 8, `AI SDK streamText of text with usage (${pu.outputTokens} tokens)`);
}

// ---- LangChain ----
{
  const llm = new ChatOpenAI({ model, apiKey: KEY || 'unused', configuration: { baseURL: BASE + '/v1' },
    maxTokens: 80, temperature: 1, maxRetries: 0 });
  const bound = llm.bindTools([{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: weather } }], { tool_choice: 'required' });
  let agg;
  let n = 0;
  for await (const chunk of await bound.stream(messages.map((m) => [m.role, m.content]))) {
    agg = agg ? agg.concat(chunk) : chunk;
    n++;
  }
  const calls = agg?.tool_calls ?? [];
  check(calls.length >= 1 && calls.every((c) => c.name === 'get_weather' && ajv.validate(weather, c.args)),
    `LangChain bindTools + stream: the aggregated calls are named once and valid (${calls.map((c) => c.name)}, ${n} chunks)`);
  check(agg?.usage_metadata?.input_tokens > 0 && agg.usage_metadata.output_tokens > 0,
    'LangChain stream: usage metadata from the usage chunk');
}

// ---- Chat Completions fields ----
const toolsBody = { tools: [{ type: 'function', function: { name: 'get_weather', parameters: weather } },
  { type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string',
    maxLength: 8 } }, required: ['q'], additionalProperties: false } } }], tool_choice: 'required', max_tokens: 120,
  temperature: 1 };
{
  const sys = await chat({ messages: [{ role: 'system', content: 'Be terse.' }, ...messages], max_tokens: 8, temperature: 0 });
  const dev = await chat({ messages: [{ role: 'developer', content: 'Be terse.' }, ...messages], max_tokens: 8, temperature: 0 });
  check(dev.status === 200 && dev.json.usage.prompt_tokens === sys.json.usage.prompt_tokens &&
    dev.json.choices[0].message.content === sys.json.choices[0].message.content,
    'a developer message is the system prompt (same prompt, same answer)');
  const mct = await chat({ max_completion_tokens: 5, temperature: 0 });
  const mt = await chat({ max_tokens: 5, temperature: 0 });
  check(mct.json.usage.completion_tokens === 5 && mct.json.choices[0].message.content === mt.json.choices[0].message.content,
    'max_completion_tokens limits the answer like max_tokens');
  const hist = (field) => chat({ max_tokens: 4, temperature: 0, messages: [...messages,
    { role: 'assistant', content: 'Sunny.', [field]: 'The user wants the weather.' }, { role: 'user', content: 'More?' }] });
  const [a, b] = [await hist('reasoning_content'), await hist('reasoning')];
  check(a.status === 200 && b.status === 200 && a.json.usage.prompt_tokens === b.json.usage.prompt_tokens,
    'reasoning and reasoning_content are both taken in the history');
  const wrong = await chat({ messages: [{ role: 'user', content: 'x', reasoning: 'y' }], max_tokens: 2 });
  check(wrong.status === 400 && /reasoning/.test(wrong.json?.error?.param ?? ''),
    `reasoning is read as the reasoning field (on a user message → 400, param ${wrong.json?.error?.param})`);
}
{
  // parallel_tool_calls: the same seeds give several calls when allowed, exactly one when false
  let several = 0, single = 0;
  const seeds = [1, 2, 3, 4, 5, 6];
  for (const seed of seeds) {
    const on = await chat({ ...toolsBody, seed });
    const off = await chat({ ...toolsBody, seed, parallel_tool_calls: false });
    if ((on.json.choices?.[0]?.message?.tool_calls?.length ?? 0) > 1) several++;
    if (off.json.choices?.[0]?.message?.tool_calls?.length === 1 && off.json.choices[0].finish_reason === 'tool_calls') single++;
  }
  check(several >= 1, `several tool calls when parallel_tool_calls is allowed (${several}/${seeds.length} seeds)`);
  check(single === seeds.length, `parallel_tool_calls false: exactly one call (${single}/${seeds.length})`);
  const r = await fetch(BASE + '/v1/chat/completions', { method: 'POST', headers: auth(), body: JSON.stringify({
    model, messages, ...toolsBody, seed: 2, parallel_tool_calls: false, stream: true }) });
  const chunks = (await r.text()).split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)));
  const idx = new Set(chunks.flatMap((c) => (c.choices[0]?.delta?.tool_calls ?? []).map((t) => t.index)));
  check(idx.size === 1 && idx.has(0), 'parallel_tool_calls false while streaming: deltas of one call only');
}
{
  const r = await fetch(BASE + '/v1/chat/completions', { method: 'POST', headers: auth(), body: JSON.stringify({
    model, messages, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3, stream: true,
    stream_options: { include_usage: true } }) });
  const chunks = (await r.text()).split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)));
  const entries = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
  const last = chunks[chunks.length - 1];
  const whole = await chat({ max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3 });
  const ref = whole.json.choices[0].logprobs.content;
  check(entries.length === last.usage?.completion_tokens && last.choices.length === 0 && entries.length === ref.length &&
    entries.every((e, i) => e.top_logprobs.length === 3 && e.token === ref[i].token &&
      Math.abs(e.logprob - ref[i].logprob) < 1e-4 && e.logprob <= 0),
    `logprobs and top_logprobs streamed: one entry a token, equal to the whole answer's (${entries.length})`);
}
{
  const over = await chat({ messages: [{ role: 'user', content: 'word '.repeat(info.context_length * 2) }], max_tokens: 4 });
  check(over.status === 400 && over.json?.error?.code === 'context_length_exceeded' &&
    over.json.error.message.includes(String(info.context_length)),
    `context overflow → 400 context_length_exceeded (${over.json?.error?.message})`);
}
done();
