// conns.test.mjs — slow clients cannot lock others out (a server with the default connection limits and read
// timeout): 120 connections from 127.0.0.1 each send one header byte every 3 s; /health and a completion
// from the same address still answer within a second, over several drips. The test stops its connections
// itself after about 8 s.
import http from 'node:http';
import net from 'node:net';
import { BASE, check, done, sleep, post, metrics } from './common.mjs';

const u = new URL(BASE);
const slow = [];
for (let i = 0; i < 120; i++) {
  const s = net.connect({ host: u.hostname, port: Number(u.port) });
  s.on('error', () => {});
  slow.push(s);
}
const header = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(200);
let k = 0;
const drip = () => { for (const s of slow) if (!s.destroyed) s.write(header[k % header.length]); k++; };
drip();
const timer = setInterval(drip, 3000);
await sleep(300);
const times = [];
let allOk = true;
for (let i = 0; i < 8; i++) {
  const t0 = performance.now();
  // a fresh connection each time, as a health probe opens one
  const status = await new Promise((resolve) => {
    const req = http.get({ host: u.hostname, port: u.port, path: '/health', agent: false, timeout: 5000 }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(0));
  });
  times.push(Math.round(performance.now() - t0));
  allOk &&= status === 200;
  await sleep(1000);
}
const slowest = Math.max(...times);
check(allOk && slowest < 1000, `/health answers beside 120 slow connections from its address (ms: ${times.join(' ')})`);
const t0 = performance.now();
const c = await post('/v1/completions', JSON.stringify({ prompt: 'hi', max_tokens: 3 }), { headers: { Connection: 'close' } });
check(c.status === 200 && performance.now() - t0 < 1000, `a completion answers too (${Math.round(performance.now() - t0)} ms)`);
const m = await metrics();
const open = slow.filter((s) => !s.destroyed && s.readyState === 'open' && !s.readableEnded).length;
check(m.deltafin_connections_evicted_total >= 100 && open <= 16,
  `the longest-waiting slow connections made room (${m.deltafin_connections_evicted_total} evicted, ${open} still open)`);
clearInterval(timer);
for (const s of slow) s.destroy();
done();
