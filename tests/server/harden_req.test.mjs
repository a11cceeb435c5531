// harden_req.test.mjs — what a request must not be able to do: constrained answers cut by max_tokens say
// "length" (never "stop" with half a document, never "tool_calls" with no call); schemas that compiled in
// exponential time are answered at once; keywords that cannot be enforced are refused naming them; /tokenize
// with pieces answers a large text within its stated memory (DELTAFIN_PID: the server's peak is read from
// /proc); a Host header naming another site is refused when the server has no key (DELTAFIN_URL_NOKEY).
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { BASE, KEY, check, done, post } from './common.mjs';

const model = 'm';
const messages = [{ role: 'user', content: 'JSON please' }];
const chat = (body) => post('/v1/chat/completions', JSON.stringify({ model, messages, ...body }));

// a budget smaller than the shortest document: generation runs to max_tokens and says so
const schema = { type: 'object', properties: { name: { type: 'string', minLength: 6 }, tags: { type: 'array',
  items: { type: 'string', format: 'date' }, minItems: 2 } }, required: ['name', 'tags'], additionalProperties: false };
let cut = 0, nCut = 0;
for (const max_tokens of [1, 2, 5, 9]) {
  for (const stream of [false, true]) {
    nCut++;
    const r = await chat({ max_tokens, temperature: 1, seed: max_tokens, stream,
      response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
    let finish, text = '';
    if (stream) {
      for (const line of r.text.split('\n')) {
        if (!line.startsWith('data: {')) continue;
        const ch = JSON.parse(line.slice(6)).choices?.[0];
        text += ch?.delta?.content ?? '';
        finish = ch?.finish_reason ?? finish;
      }
    } else {
      finish = r.json?.choices?.[0]?.finish_reason;
      text = r.json?.choices?.[0]?.message?.content ?? '';
    }
    if (r.status === 200 && finish === 'length') cut++;
    else console.log(`# max_tokens ${max_tokens} stream ${stream}: ${r.status} ${finish} ${text}`);
  }
}
check(cut === nCut, `json_schema cut by max_tokens: finish_reason "length" in ${cut}/${nCut} (plain and streamed)`);

// a forced tool call cut short: "length", and no tool_calls list at all
const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
  properties: { city: { type: 'string', minLength: 8 } }, required: ['city'], additionalProperties: false } } }];
let tcOk = 0;
for (const max_tokens of [1, 3, 6]) {
  const r = await chat({ max_tokens, temperature: 1, seed: 5, tools, tool_choice: 'required' });
  const ch = r.json?.choices?.[0];
  if (r.status === 200 && ch.finish_reason === 'length' && !(ch.message.tool_calls?.length === 0) &&
      ch.finish_reason !== 'tool_calls') tcOk++;
  else console.log('# tool call cut: ' + r.status + ' ' + JSON.stringify(ch ?? r.json));
}
check(tcOk === 3, `forced tool call cut by max_tokens: "length" and never an empty tool_calls (${tcOk}/3)`);

// schemas that took gigabytes to compile: answered (accepted or refused) within seconds
function mixed(k) {
  const defs = {};
  for (let i = 0; i < k; i++) {
    const ref = { $ref: `#/definitions/n${i + 1}` };
    defs[`n${i}`] = { type: ['object', 'array', 'object'], properties: { x: ref, y: { ...ref } }, items: { ...ref } };
  }
  defs[`n${k}`] = { type: ['string', 'string'] };
  return { $ref: '#/definitions/n0', definitions: defs };
}
let t0 = Date.now();
const big = await chat({ max_tokens: 8, response_format: { type: 'json_schema', json_schema: { name: 'm',
  schema: mixed(12) } } });
check(big.status === 200 && Date.now() - t0 < 30000,
  `a schema of type lists and $refs 12 levels deep: ${big.status} in ${Date.now() - t0} ms`);

// constraints that cannot be enforced: 400 naming them
const refusals = [
  [{ type: 'integer', maximum: 5, enum: [10] }, /enum/],
  [{ $ref: '#/$defs/a', type: 'object', $defs: { a: { type: 'object' } } }, /type.*\$ref/],
  [{ anyOf: [{ type: 'string' }, { type: 'integer' }], minLength: 2 }, /minLength.*anyOf/],
  [{ type: 'string', format: 'hostname' }, /hostname/],
];
let refusedOk = 0;
for (const [s, re] of refusals) {
  const r = await chat({ max_tokens: 8, response_format: { type: 'json_schema', json_schema: { name: 'r', schema: s } } });
  if (r.status === 400 && re.test(r.json?.error?.message ?? '')) refusedOk++;
  else console.log('# refusal: ' + JSON.stringify(s) + ' -> ' + r.status + ' ' + JSON.stringify(r.json));
}
check(refusedOk === refusals.length, `unenforceable keywords refused with 400 naming them (${refusedOk}/${refusals.length})`);

// /tokenize with pieces: the same ids as without, pieces that concatenate to the text, bounded memory
const vmhwm = () => process.env.DELTAFIN_PID
  ? Number(/VmHWM:\s*(\d+)/.exec(readFileSync(`/proc/${process.env.DELTAFIN_PID}/status`, 'utf8'))[1]) * 1024 : 0;
const mib = Number(process.env.TOKENIZE_MIB || 2);
const words = ['the ', 'jury ', 'said ', 'é', '日本 ', '\u0001', '"q" ', '\\ ', '12345 ', 'x'];
// the request body (JSON-escaped text) stays under the 16 MiB limit
const unit = words.join('');
const per = Buffer.byteLength(JSON.stringify(unit)) - 2;
const text = unit.repeat(Math.floor((mib * 1024 * 1024 - 64) / per));
const before = vmhwm();
t0 = Date.now();
const plain = await post('/tokenize', JSON.stringify({ content: text.slice(0, 20000) }));
const withp = await post('/tokenize', JSON.stringify({ content: text.slice(0, 20000), with_pieces: true }));
const ids = plain.json?.tokens ?? [];
const pieces = withp.json?.tokens ?? [];
const same = ids.length > 0 && ids.length === pieces.length && pieces.every((p, i) => p.id === ids[i]);
const bytes = Buffer.concat(pieces.map((p) => typeof p.piece === 'string' ? Buffer.from(p.piece) : Buffer.from(p.piece)));
check(same && bytes.toString() === text.slice(0, 20000),
  `/tokenize with_pieces: same ids as without (${ids.length}), pieces join to the text`);
const hugeBody = JSON.stringify({ content: text, with_pieces: true });
const huge = await post('/tokenize', hugeBody);
const n = huge.json?.tokens?.length ?? 0;
const grew = vmhwm() - before;
const body = hugeBody.length;
if (huge.status !== 200) console.log('# /tokenize: ' + huge.status + ' ' + huge.text.slice(0, 300));
check(huge.status === 200 && n > body / 8 && (!process.env.DELTAFIN_PID || grew < 7 * body),
  `/tokenize with_pieces on ${(body / 1048576).toFixed(1)} MiB: ${n} tokens in ${Date.now() - t0} ms, ` +
  (process.env.DELTAFIN_PID ? `server peak grew ${(grew / 1048576).toFixed(0)} MiB (bound 7 x body)` : 'peak not measured'));

// DNS rebinding: without a key, a Host naming another site is refused; addresses and localhost are not
function rawGet(url, host) {
  return new Promise((resolve) => {
    const u = new URL(url);
    const req = http.request({ host: u.hostname, port: u.port, path: '/v1/models', headers: host ? { Host: host } : {} },
      (res) => { res.resume(); res.on('end', () => resolve(res.statusCode)); });
    req.on('error', () => resolve(0));
    req.end();
  });
}
const nokey = process.env.DELTAFIN_URL_NOKEY;
if (nokey) {
  const port = new URL(nokey).port;
  const cases = [[`evil.example:${port}`, 403], [`evil.example`, 403], [`localhost.evil.example:${port}`, 403],
    [`127.0.0.1:${port}`, 200], [`localhost:${port}`, 200], [`LOCALHOST.:${port}`, 200], [`app.localhost:${port}`, 200],
    [`[::1]:${port}`, 200], [`10.1.2.3:${port}`, 200], [`allowed.example:${port}`, 200], [`evil.example:x`, 403]];
  let hostOk = 0;
  for (const [h, want] of cases) {
    const got = await rawGet(nokey, h);
    if (got === want) hostOk++;
    else console.log(`# Host ${h}: ${got}, want ${want}`);
  }
  check(hostOk === cases.length, `Host header without a key: other sites 403, addresses/localhost/--allowed-host 200 (${hostOk}/${cases.length})`);
  check(await rawGet(BASE, `evil.example:${port}`) !== 403 || KEY === '', 'with an API key the Host is not what guards');
}
done();
