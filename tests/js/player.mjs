// Opens PAGE in Debian's headless Chromium (playwright-core drives
// /usr/bin/chromium; no browser is downloaded), plays its #player muted,
// hovers its #seek bar at FRACTION of its width, and prints as JSON what
// a viewer would get: seconds played (-1: never 2 s), the duration, the
// storyboard cues the browser parsed, the #preview's style, and the
// console's errors (CORS refusals among them).
//
// Usage: node player.mjs PAGE [FRACTION]
import { chromium } from 'playwright-core';

const [page_url, fraction = '0.5'] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  // As root, without the sandbox; no background traffic (the machine has
  // no network beyond the registries); autoplay without a gesture.
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--autoplay-policy=no-user-gesture-required'],
});
try {
  const page = await browser.newPage({ viewport: { width: 800, height: 600 } });
  const errors = [];
  page.on('console', (message) => {
    if (message.type() === 'error') errors.push(message.text());
  });
  await page.goto(page_url);
  await page.evaluate(() => {
    const video = document.getElementById('player');
    video.muted = true;
    video.play().catch(() => {});
  });
  // Until 2 s have played, or the browser refused the package (CORS), or
  // 20 s passed: played stays -1 unless 2 s played, and the errors say why.
  let played = -1;
  for (let waited = 0; waited < 20000; waited += 100) {
    const now = await page.evaluate(() => document.getElementById('player').currentTime);
    if (now >= 2) {
      played = now;
      break;
    }
    if (errors.some((e) => e.includes('CORS policy'))) break;
    await page.waitForTimeout(100);
  }
  const cues = await page.evaluate(() => {
    const track = document.querySelector('#player track');
    return track && track.track.cues ? track.track.cues.length : 0;
  });
  const seek = await page.$('#seek');
  const box = await seek.boundingBox();
  await page.mouse.move(box.x + box.width * Number(fraction), box.y + box.height / 2);
  await page.waitForFunction(() => !document.getElementById('preview').hidden, null,
    { timeout: 2000 }).catch(() => {});
  const preview = await page.evaluate(() => {
    const p = document.getElementById('preview');
    return { hidden: p.hidden, background: p.style.background, width: p.style.width,
      height: p.style.height };
  });
  const duration = await page.evaluate(() => document.getElementById('player').duration);
  process.stdout.write(JSON.stringify({ played, duration, cues, preview, errors }));
} finally {
  await browser.close();
}
