// agents.test.mjs — reasoning through both APIs, and the agent CLIs end to end. DELTAFIN_URL_THINK serves a
// copy of the bundled model whose tokenizer names two reserved tokens <think> and </think>: the chat template
// then opens a think block and the model, never trained to close it, reasons until max_tokens, which is what
// the thinking paths need. DELTAFIN_URL_LONG serves a copy with a 4,096-token context (the architecture has no
// position encoding), enough for Claude Code's and Codex's prompts. `claude -p` and `codex exec` run once each
// if their npm packages are installed. The bundled model never ends its own turn, and Claude Code fails a turn
// that only ever stops at max_tokens, so Claude Code's requests pass through a proxy here that adds stop
// sequences; everything else of the request is Claude Code's own.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { check, done } from './common.mjs';

const THINK = process.env.DELTAFIN_URL_THINK, LONG = process.env.DELTAFIN_URL_LONG;
const here = path.dirname(new URL(import.meta.url).pathname);
const anthropic = new Anthropic({ baseURL: THINK, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const openai = new OpenAI({ baseURL: THINK + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });

// ---- thinking (Anthropic) ----
{
  const messages = [{ role: 'user', content: 'Think, then greet me.' }];
  const m = await anthropic.messages.create({ model: 'claude-x', messages, max_tokens: 12, temperature: 0 });
  const th = m.content.find((b) => b.type === 'thinking');
  check(th && th.thinking.length > 0 && typeof th.signature === 'string' && m.stop_reason === 'max_tokens',
    `a reasoning model's answer starts with a thinking block (${JSON.stringify(th?.thinking)})`);
  const s = anthropic.messages.stream({ model: 'claude-x', messages, max_tokens: 12, temperature: 0 });
  let deltas = '';
  s.on('thinking', (d) => { deltas += d; });
  const fm = await s.finalMessage();
  const fth = fm.content.find((b) => b.type === 'thinking');
  check(fth && deltas === fth.thinking && fth.thinking === th.thinking && fth.signature.length > 0,
    'thinking_delta events make the streamed thinking block, equal to the non-streamed one');
  const off = await anthropic.messages.create({ model: 'claude-x', messages, max_tokens: 6, thinking: { type: 'disabled' } });
  check(!off.content.some((b) => b.type === 'thinking') && off.content[0]?.type === 'text', 'thinking disabled: a text answer');
  // within a tool loop the chat template keeps the assistant's reasoning: the thinking block is in the prompt
  const tools = [{ name: 'lookup', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }];
  const loop = (assistant) => [{ role: 'user', content: 'Look it up.' }, { role: 'assistant', content: assistant },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'functions.lookup:0', content: 'found' }] }];
  const use = { type: 'tool_use', id: 'functions.lookup:0', name: 'lookup', input: { q: 'x' } };
  const withThinking = await anthropic.messages.countTokens({ model: 'claude-x', tools,
    messages: loop([{ type: 'thinking', thinking: 'I should look this up first.', signature: 'abc' }, use]) });
  const without = await anthropic.messages.countTokens({ model: 'claude-x', tools, messages: loop([use]) });
  check(withThinking.input_tokens >= without.input_tokens + 6,
    `a signed thinking block in the history is the assistant's reasoning (${without.input_tokens} → ${withThinking.input_tokens} tokens)`);
}

// ---- reasoning (Responses) ----
{
  const r = await openai.responses.create({ model: 'm', input: 'Think.', max_output_tokens: 8, temperature: 0, reasoning: { effort: 'high' } });
  const rs = r.output.find((o) => o.type === 'reasoning');
  check(rs && rs.id.startsWith('rs_') && rs.content?.[0]?.type === 'reasoning_text' && rs.content[0].text.length > 0 &&
    r.usage.output_tokens_details.reasoning_tokens > 0, 'responses: a reasoning item with reasoning_text and reasoning_tokens');
  const s = openai.responses.stream({ model: 'm', input: 'Think.', max_output_tokens: 8, temperature: 0 });
  let d = '';
  for await (const ev of s) if (ev.type === 'response.reasoning_text.delta') d += ev.delta;
  const fin = await s.finalResponse();
  check(d === rs.content[0].text && fin.output[0].content[0].text === d, 'responses stream: reasoning_text deltas equal the item');
}

// ---- the CLIs ----

// A proxy in front of url that counts requests by path; edit(body) may change JSON bodies of POSTs.
function proxy(url, edit) {
  const seen = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      let body = Buffer.concat(chunks);
      seen.push({ method: req.method, path: req.url, body: body.toString() });
      if (edit && req.method === 'POST' && body.length) body = Buffer.from(JSON.stringify(edit(JSON.parse(body))));
      const headers = { ...req.headers };
      delete headers.host;
      delete headers['content-length'];
      try {
        const r = await fetch(url + req.url, { method: req.method, headers,
          body: req.method === 'GET' || req.method === 'HEAD' ? undefined : body });
        res.writeHead(r.status, { 'content-type': r.headers.get('content-type') || 'application/json' });
        if (r.body) for await (const c of r.body) res.write(c);
        res.end();
      } catch (e) {
        res.writeHead(502);
        res.end(String(e));
      }
    });
  });
  return new Promise((ok) => server.listen(0, '127.0.0.1', () => ok({ url: `http://127.0.0.1:${server.address().port}`, seen, server })));
}

function run(cmd, args, env, timeoutMs) {
  return new Promise((ok) => {
    const p = spawn(cmd, args, { env: { PATH: process.env.PATH, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    const t = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('close', (code, sig) => { clearTimeout(t); ok({ code, sig, out, err }); });
  });
}

// The CLI's path when its package is installed and its binary runs (a package whose postinstall did not
// run leaves a stub), else why not.
async function installed(bin, pkg) {
  const p = path.join(here, 'node_modules', '.bin', bin);
  if (!fs.existsSync(p)) return { why: `${pkg} is not installed` };
  const v = await run(p, ['--version'], { HOME: os.tmpdir() }, 30000);
  return v.code === 0 ? { path: p, version: v.out.trim() } : { why: `${pkg} is installed but '${bin} --version' fails` };
}

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'deltafin-agents-'));
const claude = await installed('claude', '@anthropic-ai/claude-code');
if (!claude.path) {
  console.log(`ok - claude -p through /v1/messages # SKIP ${claude.why}`);
} else {
  const px = await proxy(LONG, (b) => ({ ...b, stop_sequences: ['.', ',', '\n', '!', '?'] }));
  const t0 = Date.now();
  const r = await run(claude.path, ['-p', 'hi', '--bare', '--system-prompt', 'Be brief.', '--tools', '', '--model', 'claude-sonnet-4-5'],
    { HOME: home, ANTHROPIC_BASE_URL: px.url, ANTHROPIC_API_KEY: 'sk-deltafin-test', DISABLE_TELEMETRY: '1',
      DISABLE_AUTOUPDATER: '1', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' }, 120000);
  const msgs = px.seen.filter((s) => s.path.startsWith('/v1/messages'));
  const billing = msgs.some((s) => s.body.includes('x-anthropic-billing-header'));
  check(r.code === 0 && msgs.length >= 1, `claude -p "hi" (${claude.version}) through /v1/messages exits 0 (${msgs.length} requests, ` +
    `billing header sent: ${billing}, ${Date.now() - t0} ms)`);
  if (r.code !== 0) console.log('# claude: ' + (r.out + r.err).slice(-800).replace(/\n/g, '\n# '));
  px.server.close();
}

const codex = await installed('codex', '@openai/codex');
if (!codex.path) {
  console.log(`ok - codex exec through /v1/responses # SKIP ${codex.why}`);
} else {
  const px = await proxy(LONG, null);
  const codexHome = path.join(home, 'codex');
  fs.mkdirSync(codexHome, { recursive: true });
  fs.writeFileSync(path.join(codexHome, 'instructions.md'), 'Answer briefly.\n');
  // Codex's own instructions and tools make ~9,000 tokens; these settings leave ~2,000, which the tiny model
  // prefills in seconds
  fs.writeFileSync(path.join(codexHome, 'config.toml'), `model = "deltafin-tiny"
model_provider = "deltafin"
model_instructions_file = "${path.join(codexHome, 'instructions.md')}"
include_permissions_instructions = false
include_environment_context = false
include_apps_instructions = false
web_search = "disabled"
[features]
multi_agent = false
goals = false
apps = false
[model_providers.deltafin]
name = "deltafin"
base_url = "${px.url}/v1"
wire_api = "responses"
env_key = "DELTAFIN_TEST_KEY"
`);
  const t0 = Date.now();
  const r = await run(codex.path, ['exec', '--skip-git-repo-check', '-C', home, 'hi'],
    { HOME: home, CODEX_HOME: codexHome, DELTAFIN_TEST_KEY: 'unused' }, 300000);
  const reqs = px.seen.filter((s) => s.path === '/v1/responses');
  const custom = reqs.some((s) => { try { return JSON.parse(s.body).tools.some((t) => t.type !== 'function'); } catch { return false; } });
  check(r.code === 0 && reqs.length >= 1, `codex exec "hi" (${codex.version}) through /v1/responses exits 0 (${reqs.length} requests, ` +
    `non-function tools sent: ${custom}, ${Date.now() - t0} ms)`);
  if (r.code !== 0) console.log('# codex: ' + (r.out + r.err).slice(-800).replace(/\n/g, '\n# '));
  px.server.close();
}
fs.rmSync(home, { recursive: true, force: true });
done();
