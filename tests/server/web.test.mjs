// web.test.mjs — the chat page at "/" in headless Chromium (Debian's /usr/bin/chromium driven by
// playwright-core): an answer streams in, tokens/s is shown, a screenshot is taken of it, the stop button
// ends a long answer, the system prompt is sent, an error turn is recoverable, and New chat starts over.
import fs from 'node:fs';
import { chromium } from 'playwright-core';
import { BASE, KEY, check, done } from './common.mjs';

const exe = process.env.CHROMIUM || '/usr/bin/chromium';
const shot = process.env.SCREENSHOT || 'build/web-chat.png';
const browser = await chromium.launch({ executablePath: exe, headless: true, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(BASE + '/');
  if (KEY) {
    await page.fill('#key', KEY);
    await page.dispatchEvent('#key', 'change');
  }
  await page.waitForFunction(() => !document.getElementById('model').textContent.includes('?'), null,
    { timeout: 10000 });
  check(/model: \S+/.test(await page.textContent('#model')), 'page shows the served model');
  await page.$eval('#temp', (e) => { e.value = '0'; e.dispatchEvent(new Event('input')); });

  // stop: a long greedy answer is cut short by the stop button
  await page.fill('#maxtok', '3000');
  await page.fill('#input', 'Hello');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => document.querySelector('.assistant')?.textContent.length > 5, null,
    { timeout: 20000 });
  await page.click('#stop', { timeout: 5000 });
  await page.waitForFunction(() => document.querySelector('.assistant')?.dataset.done === '1', null,
    { timeout: 10000 });
  const stopped = await page.locator('.assistant').first().textContent();
  check(stopped.includes('[stopped]'), 'the stop button ends a streaming answer');

  // a fresh conversation: an answer streams in and is visible in a screenshot
  await page.reload();
  if (KEY) {
    await page.fill('#key', KEY);
    await page.dispatchEvent('#key', 'change');
  }
  await page.$eval('#temp', (e) => { e.value = '0'; e.dispatchEvent(new Event('input')); });
  await page.fill('#maxtok', '40');
  await page.fill('#input', 'Hello, who are you?');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.assistant[data-done="1"]', { timeout: 30000 });
  const answer = await page.textContent('.assistant');
  check(answer && answer.trim().length > 0, `an answer appeared (${JSON.stringify(answer.slice(0, 40))}…)`);
  check(/tokens/.test(await page.textContent('#stats')), 'tokens/s is displayed');
  fs.mkdirSync(shot.replace(/\/[^/]*$/, '') || '.', { recursive: true });
  const png = await page.screenshot({ path: shot });
  // the answer bubble must be visible in the screenshot: its crop must not look like blank page
  const box = await page.locator('.assistant').first().boundingBox();
  const crop = await page.screenshot({ clip: box });
  const blank = await page.screenshot({ clip: { ...box, y: box.y + box.height + 150 } });
  check(png.length > 1000 && box.height > 10 && crop.length > 2 * blank.length,
    `screenshot shows the answer (${crop.length} vs ${blank.length} bytes blank), saved to ${shot}`);

  // a system prompt goes first in the request; an error leaves no broken turn behind and the text comes
  // back into the input; the new-chat button starts over
  const bodies = [];
  page.on('request', (rq) => { if (rq.url().endsWith('/v1/chat/completions')) bodies.push(JSON.parse(rq.postData())); });
  await page.fill('#system', 'Be brief.');
  await page.fill('#maxtok', '999999999999');   // refused by the server: an error turn
  await page.fill('#input', 'This one fails');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.assistant.error[data-done="1"]', { timeout: 30000 });
  check(await page.inputValue('#input') === 'This one fails', 'after an error the message is back in the input');
  await page.fill('#maxtok', '8');
  await page.fill('#input', 'Second try');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => [...document.querySelectorAll('.assistant')].pop()?.dataset.done === '1' &&
    !document.querySelectorAll('.assistant')[document.querySelectorAll('.assistant').length - 1].classList.contains('error'),
    null, { timeout: 30000 });
  const last = bodies[bodies.length - 1];
  check(last && last.messages[0].role === 'system' && last.messages[0].content === 'Be brief.' &&
    !last.messages.some((m) => m.content === 'This one fails') && last.messages[last.messages.length - 1].content === 'Second try',
    'the system prompt is sent first and the failed turn is not');
  await page.click('#newchat');
  check(await page.locator('.msg').count() === 0, 'the new-chat button clears the conversation');
  await page.fill('#input', 'Fresh start');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.assistant[data-done="1"]', { timeout: 30000 });
  const fresh = bodies[bodies.length - 1];
  check(fresh.messages.length === 2 && fresh.messages[1].content === 'Fresh start', 'a new chat sends only its own turn');
  check(errors.length === 0, `no JavaScript errors (${errors.join('; ')})`);
} finally {
  await browser.close();
}
done();
