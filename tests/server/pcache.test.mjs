// pcache.test.mjs PHASE — the prompt cache across server restarts (test_server.sh restarts the server
// between phases, on one --prompt-cache folder). cold: a 120-token prompt is prefilled and its state saved;
// warm (after a restart): the same prompt restores it and answers with the same tokens and log-probabilities
// as the cold prefill; damaged (after a restart with the saved state's bytes flipped): the entry is refused
// on load and the answer is still the cold one. RESULT names the file that carries the cold answer over.
// While the library cannot save session state, the phases print "# SKIP".
import fs from 'node:fs';
import { BASE, check, done, post, metrics, auth } from './common.mjs';

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
} else if (phase === 'warm') {
  check(m.deltafin_prompt_cache_restored_total === 1 && r.json.usage.prompt_tokens_details.cached_tokens === 119,
    `after a restart the prompt state is restored (${r.json.usage.prompt_tokens_details.cached_tokens} of 120 tokens)`);
  check(answer === fs.readFileSync(file, 'utf8'), 'the restored state gives the same tokens and logprobs as a cold prefill');
} else {
  check(m.deltafin_prompt_cache_restored_total === 0 && r.json.usage.prompt_tokens_details.cached_tokens === 0,
    'a damaged saved state is refused on load');
  check(answer === fs.readFileSync(file, 'utf8'), 'after refusing it the answer is the cold one');
}
done();
