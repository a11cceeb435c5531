// json_schema.test.mjs — response_format json_object and json_schema with the official `openai` package:
// nested objects, bounded arrays, enums, numbers with bounds, string formats, a tight max_tokens, streaming.
// Every answer is parsed and validated with ajv (+ ajv-formats); the bundled model knows no chat, so only the
// grammar that constrains sampling can make these pass.
import OpenAI from 'openai';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { BASE, KEY, check, done, post } from './common.mjs';

const client = new OpenAI({ baseURL: BASE + '/v1', apiKey: KEY || 'unused', maxRetries: 0, timeout: 120000 });
const model = (await client.models.list()).data[0].id;
const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv);
const valid = (schema, value) => {
  const ok = ajv.validate(schema, value);
  if (!ok) console.log('# ajv: ' + ajv.errorsText() + ' in ' + JSON.stringify(value));
  return ok;
};
const parse = (s) => { try { return JSON.parse(s); } catch { return undefined; } };

const messages = [{ role: 'user', content: 'JSON please' }];

// response_format json_schema: nested objects, arrays with bounds, enums, numbers, formats
const schemas = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 20 }, age: { type: 'integer', minimum: 0, maximum: 120 },
    tags: { type: 'array', items: { type: 'string', maxLength: 8 }, minItems: 1, maxItems: 3 } },
  required: ['name', 'age', 'tags'], additionalProperties: false },
  { type: 'object', properties: { when: { type: 'string', format: 'date' }, at: { type: 'string', format: 'date-time' },
    id: { type: 'string', format: 'uuid' }, mail: { type: 'string', format: 'email' } },
  required: ['when', 'at', 'id', 'mail'], additionalProperties: false },
  { type: 'object', properties: { point: { type: 'object', properties: { x: { type: 'number', minimum: -1.5, maximum: 1.5 },
    y: { type: 'number', exclusiveMinimum: 0, maximum: 10 } }, required: ['x', 'y'], additionalProperties: false },
  kind: { enum: ['a', 'b', 3, null] }, ok: { type: 'boolean' }, note: { type: ['string', 'null'], maxLength: 5 } },
  required: ['point', 'kind', 'ok', 'note'], additionalProperties: false },
  { type: 'array', items: { type: 'object', properties: { v: { type: 'integer', minimum: -5, maximum: 5 } },
    required: ['v'], additionalProperties: false }, minItems: 2, maxItems: 4 },
];
let okSchema = 0, nSchema = 0;
for (const [i, schema] of schemas.entries()) {
  for (const seed of [21 + i]) {
    nSchema++;
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Answer in JSON.' }],
      max_tokens: i === 1 ? 160 : 100, temperature: 1, seed,
      response_format: { type: 'json_schema', json_schema: { name: 's' + i, schema, strict: true } } });
    const v = parse(r.choices[0].message.content);
    if (r.choices[0].finish_reason === 'stop' && v !== undefined && valid(schema, v)) okSchema++;
    else console.log('# json_schema: ' + JSON.stringify(r.choices[0]));
  }
}
check(okSchema === nSchema, `json_schema: ${okSchema}/${nSchema} answers parse and validate`);

// a budget just big enough still ends with a complete document
const tight = { type: 'object', properties: { a: { type: 'string' }, b: { type: 'array', items: { type: 'integer' } } },
  required: ['a', 'b'], additionalProperties: false };
const rt = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'JSON please' }],
  max_tokens: 16, temperature: 1, seed: 3, response_format: { type: 'json_schema', json_schema: { name: 't', schema: tight } } });
check(rt.choices[0].finish_reason === 'stop' && valid(tight, parse(rt.choices[0].message.content)),
  `json_schema with max_tokens 16: still a complete valid document (${rt.choices[0].message.content})`);

const jo = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'JSON please' }],
  max_tokens: 80, temperature: 1, seed: 4, response_format: { type: 'json_object' } });
const jv = parse(jo.choices[0].message.content);
check(jo.choices[0].finish_reason === 'stop' && jv !== null && typeof jv === 'object' && !Array.isArray(jv),
  'json_object: a JSON object');

// streamed json_schema: the concatenated deltas validate
const js = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'JSON' }], max_tokens: 100,
  temperature: 1, seed: 8, stream: true, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: schemas[0] } } });
let jtext = '';
for await (const ch of js) jtext += ch.choices[0]?.delta?.content ?? '';
check(valid(schemas[0], parse(jtext)), 'streamed json_schema output validates');

// refusals name the field
const bad = await post('/v1/chat/completions', JSON.stringify({ model, messages,
  response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: 'a+' } } } }));
check(bad.status === 400 && bad.json?.error?.param === 'response_format.json_schema.schema' &&
  /pattern/.test(bad.json.error.message), 'unsupported schema keyword: 400 naming response_format.json_schema.schema');

done();
