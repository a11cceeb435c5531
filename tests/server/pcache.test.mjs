// pcache.test.mjs PHASE — the prompt cache across server restarts (test_server.sh restarts the server
// between phases, on one --prompt-cache folder). cold: a 120-token prompt is prefilled and its state saved;
// warm (after a restart): the same prompt restores it and answers with the same tokens and log-probabilities
// as the cold prefill (the cold prefill is one pass: the saved prefix is a snapshot taken inside it); damaged (after a restart with the saved state's bytes flipped): the entry is refused
// on load and the answer is still the cold one. RESULT names the file that carries the cold answer over.
// While the library cannot save session state, the phases print "# SKIP".
import fs from 'node:fs';
import { BASE, check, done, post, metrics, auth } from './common.mjs';

// The cold prefill is one pass of 120 rows, a restored one 119 rows restored + 1 evaluated: with kernels whose
// sums depend on a product's row count (AMX, bf16 dot products) the log-probabilities agree to float rounding.
function sameAnswer(a, b) {
  const x = JSON.parse(a), y = JSON.parse(b);
  if (x.text !== y.text || x.lp?.tokens?.join('\u0000') !== y.lp?.tokens?.join('\u0000')) return false;
  const nums = (v) => JSON.stringify(v).match(/-?\d+(\.\d+)?(e-?\d+)?/g).map(Number);
  const p = nums(x.lp), q = nums(y.lp);
  return p.length === q.length && p.every((v, i) => Math.abs(v - q[i]) <= 1e-4);
}

const phase = process.argv[2];
const file = process.env.RESULT;
const prompt = Array.from({ length: 120 }, (_, i) => (i * 7 + 3) % 500);
const r = await post('/v1/completions', JSON.stringify({ prompt, max_tokens: 6, temperature: 0, logprobs: 5 }));
const props = await (await fetch(BASE + '/props', { headers: auth() })).json();
const m = await metrics();
const answer = JSON.stringify({ text: r.json?.choices?.[0]?.text, lp: r.json?.choices?.[0]?.logprobs });
check(r.status === 200, `${phase}: the request is answered`);
if (phase === 'cold' && !props.prompt_cache?.enabled) {
  fs.writeFileSync(file, 'skip');
  console.log(`ok - prompt cache restored after a restart # SKIP ${props.prompt_cache?.why_off ?? 'prompt cache off'}`);
  done();
}
if (phase === 'cold') {
  fs.writeFileSync(file, answer);
  check(m.deltafin_prompt_cache_saved_total === 1 && props.prompt_cache.entries === 1,
    'cold: the prompt state is saved (one entry)');
  check(m.deltafin_prefill_passes_total === 1 && m.deltafin_expert_reads_total > 0,
    `cold: the prompt and the saved prefix (119 of its 120 tokens) took one pass (${m.deltafin_prefill_passes_total})`);
} else if (phase === 'warm') {
  check(m.deltafin_prompt_cache_restored_total === 1 && r.json.usage.prompt_tokens_details.cached_tokens === 119,
    `after a restart the prompt state is restored (${r.json.usage.prompt_tokens_details.cached_tokens} of 120 tokens)`);
  check(sameAnswer(answer, fs.readFileSync(file, 'utf8')),
    'the restored state gives the same tokens and logprobs (within float rounding) as a cold prefill');
} else {
  check(m.deltafin_prompt_cache_restored_total === 0 && r.json.usage.prompt_tokens_details.cached_tokens === 0,
    'a damaged saved state is refused on load');
  check(sameAnswer(answer, fs.readFileSync(file, 'utf8')), 'after refusing it the answer is the cold one');
}
done();
