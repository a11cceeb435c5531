// load.test.mjs — a bounded load test on loopback: N requests (default 200), 8 at a time, mixed chat and
// completions, streaming and not. Every request must succeed (429 only if the queue were full, which 8
// clients cannot cause with the default queue), and the server's RSS must stay flat afterwards.
import fs from 'node:fs';
import OpenAI from 'openai';
import { BASE, KEY, check, done, metrics } from './common.mjs';

const N = Number(process.env.LOAD_REQUESTS || 200), CONC = 8;
const pid = process.env.DELTAFIN_PID;
const client = new OpenAI({ baseURL: BASE + '/v1', apiKey: KEY || 'unused', maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;
const rss = () => pid ? Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) : 0;

async function one(i) {
  const stream = i % 2 === 0, chat = i % 3 !== 0;
  const common = { model, max_tokens: 8 + (i % 17), temperature: (i % 5) / 4, seed: i };
  try {
    if (chat) {
      const messages = [{ role: 'user', content: `request ${i}: tell me about the number ${i * 7}` }];
      if (stream) {
        let n = 0;
        for await (const ch of await client.chat.completions.create({ ...common, messages, stream: true })) n++;
        return n >= 2 ? 'ok' : 'short';
      }
      const r = await client.chat.completions.create({ ...common, messages });
      return typeof r.choices[0].message.content === 'string' ? 'ok' : 'bad';
    }
    const prompt = i % 4 === 0 ? [1, i % 500, (i * 3) % 500] : `count ${i}`;
    if (stream) {
      let n = 0;
      for await (const ch of await client.completions.create({ ...common, prompt, stream: true })) n++;
      return n >= 1 ? 'ok' : 'short';
    }
    const r = await client.completions.create({ ...common, prompt });
    return typeof r.choices[0].text === 'string' ? 'ok' : 'bad';
  } catch (e) {
    return e.status === 429 ? '429' : `error ${e.status ?? ''} ${e.message}`;
  }
}

async function run(from, n) {
  const out = {};
  let next = from;
  const workers = Array.from({ length: CONC }, async () => {
    while (next < from + n) {
      const r = await one(next++);
      out[r] = (out[r] || 0) + 1;
    }
  });
  await Promise.all(workers);
  return out;
}

await run(0, 40);   // warm-up: allocator arenas, thread stacks, caches
const before = rss();
const t0 = Date.now();
const res = await run(1000, N);
const secs = (Date.now() - t0) / 1000;
const after = rss();
const failures = Object.entries(res).filter(([k]) => k !== 'ok' && k !== '429');
check(failures.length === 0, `${N} requests, ${CONC} concurrent, in ${secs.toFixed(1)} s: ${JSON.stringify(res)}`);
check(!pid || after - before < 16 * 1024, `RSS flat under load (${before} kB → ${after} kB)`);
const m = await metrics();
check(m.deltafin_queue_depth === 0 && m.deltafin_requests_running === 0, 'queue drained after the load');
done();
