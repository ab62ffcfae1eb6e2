// Load: LOAD_N (default 200) concurrent streaming requests, LOAD_DISCONNECT_SHARE (0.2) of the
// clients disconnecting at random points (before the first token, mid-stream). The server
// stays up; every request not cancelled gets, token for token, the greedy text its prompt gets
// alone; the KV blocks in use return to zero; no file descriptor or thread leaks.
// scripts/server_load_test.sh runs it with 1,000 requests; scripts/test.sh also runs it with 200
// against the ASan+UBSan build (a leak or a sanitizer error fails the server's exit status).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, waitIdle, httpGet, metric, settledFds, listFds, countThreads } from './server_process.mjs';

const N = Number(process.env.LOAD_N ?? 200);
const DISCONNECT_SHARE = Number(process.env.LOAD_DISCONNECT_SHARE ?? 0.2);
const MAX_TOKENS = Number(process.env.LOAD_MAX_TOKENS ?? 24);
const PROMPTS = [
  'Once upon a time,', 'The little dog', 'In the morning the sun', 'She opened the door and',
  'Tom and his friend', 'The big red ball', 'One day a bird', 'There was a quiet lake',
];

// Seeded so a failing run can be repeated.
let seed = Number(process.env.LOAD_SEED ?? 1234);
function random() { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; }

// One streaming completion over a fresh connection. cancelAfter: undefined (read to the end),
// or the number of SSE events after which the client closes the connection (0: as soon as the
// response starts, or before when cancelBeforeMs is set).
function streamCompletion(url, prompt, { cancelAfter, cancelBeforeMs } = {}) {
  return new Promise((resolve) => {
    const body = JSON.stringify({ prompt, max_tokens: MAX_TOKENS, temperature: 0, stream: true });
    const req = http.request(`${url}/v1/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } });
    let text = '';
    let finish = null;
    let events = 0;
    let buffer = '';
    let done = false;
    const end = (result) => { if (!done) { done = true; resolve(result); } };
    const cancel = () => { req.destroy(); end({ cancelled: true }); };
    if (cancelBeforeMs !== undefined) setTimeout(cancel, cancelBeforeMs);
    req.on('response', (res) => {
      if (res.statusCode !== 200) { end({ error: `status ${res.statusCode}` }); res.resume(); return; }
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buffer += d;
        let i;
        while ((i = buffer.indexOf('\n\n')) >= 0) {
          const line = buffer.slice(0, i);
          buffer = buffer.slice(i + 2);
          if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
          const chunk = JSON.parse(line.slice(6));
          text += chunk.choices[0].text;
          if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
          if (cancelAfter !== undefined && ++events >= cancelAfter) return cancel();
        }
      });
      res.on('end', () => end({ text, finish }));
      res.on('error', (e) => end({ error: String(e) }));
    });
    req.on('error', (e) => end(done ? null : { error: String(e) }));
    req.end(body);
  });
}

test(`${N} concurrent streams, ${Math.round(DISCONNECT_SHARE * 100)}% disconnecting`, { timeout: 900000 }, async () => {
  const server = await startServer(['--max-num-seqs', '256']);
  try {
    // References: each prompt alone. They also warm the server up (backend threads) before the
    // baseline counts of file descriptors and threads.
    const reference = {};
    for (const p of PROMPTS) {
      const r = await streamCompletion(server.url, p);
      assert.equal(r.finish, 'length');
      reference[p] = r.text;
    }
    await waitIdle(server.url);
    const fds = await settledFds(server.pid);
    const fdsListBefore = listFds(server.pid);
    const threads = countThreads(server.pid);

    const plans = Array.from({ length: N }, (_, i) => {
      const prompt = PROMPTS[i % PROMPTS.length];
      if (random() >= DISCONNECT_SHARE) return { prompt };
      // Half of the disconnects before any token (possibly while waiting), half mid-stream.
      return random() < 0.5 ? { prompt, cancelBeforeMs: Math.floor(random() * 300) }
                            : { prompt, cancelAfter: 1 + Math.floor(random() * (MAX_TOKENS - 2)) };
    });
    const start = Date.now();
    const results = await Promise.all(plans.map((p) => streamCompletion(server.url, p.prompt, p)));
    const seconds = (Date.now() - start) / 1000;

    let completed = 0;
    let cancelled = 0;
    for (let i = 0; i < N; ++i) {
      const r = results[i];
      assert.equal(r.error, undefined, `request ${i}: ${r.error}`);
      if (r.cancelled) { ++cancelled; continue; }
      assert.ok(plans[i].cancelAfter === undefined && plans[i].cancelBeforeMs === undefined || r.finish,
                `request ${i} neither completed nor was cancelled`);
      assert.equal(r.text, reference[plans[i].prompt], `request ${i} (${plans[i].prompt}) differs from the prompt alone`);
      assert.equal(r.finish, 'length');
      ++completed;
    }
    assert.ok(cancelled > 0 || DISCONNECT_SHARE === 0);
    const m = await waitIdle(server.url);
    assert.equal(metric(m, 'kv_blocks_used'), 0);
    const aborted = metric(m, 'request_success_total', 'finished_reason="abort"');
    assert.ok(aborted <= cancelled, `${aborted} aborted > ${cancelled} cancelled`);
    assert.equal((await httpGet(`${server.url}/health`)).status, 200, 'the server is up');
    // Every connection is closed and no thread was left behind (allow the kernel a moment).
    // Both counts are taken once they have stopped moving (settledFds), so a connection still
    // closing on the server's side at either reading is not counted.
    const fdsAfter = await settledFds(server.pid);
    assert.equal(fdsAfter, fds, `open file descriptors before/after:\nbefore ${fdsListBefore.join(', ')}\nafter  ${listFds(server.pid).join(', ')}`);
    // Threads: none added (a backend may retire an idle worker thread, never keep a new one).
    assert.ok(countThreads(server.pid) <= threads, `threads ${threads} before, ${countThreads(server.pid)} after`);
    console.log(`# load: ${N} streams in ${seconds.toFixed(1)} s: ${completed} completed identical to alone, ` +
                `${cancelled} disconnected (${aborted} aborted in the engine); KV blocks used 0; fds ${fds} -> ${fdsAfter}; ` +
                `threads ${threads} -> ${countThreads(server.pid)}`);
  } finally {
    // A sanitized server (scripts/test.sh's ASan run) reports leaks and errors on stderr at exit.
    assert.equal(await server.stop(), 0, `the server did not exit cleanly:\n${server.stderr().slice(-6000)}`);
  }
});
