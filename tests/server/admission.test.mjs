// Server options: --api-key (401), --max-body-bytes (413), --max-waiting (503),
// --enable-prefix-caching (n choices share the prompt's blocks); SIGTERM while requests run (they
// finish, or are aborted after --shutdown-timeout; the server exits 0).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, waitIdle, getMetrics, metric } from './server_process.mjs';

test('--api-key: /v1 routes need the key', async () => {
  const server = await startServer(['--api-key', 'sekret']);
  try {
    const wrong = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(wrong.models.list(), (e) => { assert.ok(e instanceof OpenAI.AuthenticationError); assert.equal(e.status, 401); return true; });
    await assert.rejects(wrong.completions.create({ model: 'x', prompt: 'a' }), OpenAI.AuthenticationError);
    const right = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'sekret', maxRetries: 0 });
    const r = await right.completions.create({ prompt: 'Hello', max_tokens: 3, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 3);
    assert.equal((await fetch(`${server.url}/health`)).status, 200, 'health needs no key');
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

test('--max-body-bytes: a larger body gets 413', async () => {
  const server = await startServer(['--max-body-bytes', '1000']);
  try {
    const r = await fetch(`${server.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'x'.repeat(5000) }) });
    assert.equal(r.status, 413);
    assert.equal((await r.json()).error.code, 'request_too_large');
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
    assert.equal((await client.completions.create({ prompt: 'Hello', max_tokens: 2 })).usage.completion_tokens, 2);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

test('--max-waiting: requests beyond the waiting queue get 503, the others complete', async () => {
  const server = await startServer(['--max-waiting', '2', '--max-num-seqs', '1']);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const results = await Promise.allSettled(Array.from({ length: 8 }, () =>
      client.completions.create({ prompt: 'Hello', max_tokens: 64, ignore_eos: true, temperature: 0 })));
    const rejected = results.filter((r) => r.status === 'rejected');
    const done = results.filter((r) => r.status === 'fulfilled');
    assert.ok(rejected.length > 0, 'some were refused');
    assert.ok(done.length >= 2, 'the admitted ones completed');
    for (const r of rejected) { assert.ok(r.reason instanceof OpenAI.InternalServerError); assert.equal(r.reason.status, 503); }
    for (const r of done) assert.equal(r.value.usage.completion_tokens, 64);
    await waitIdle(server.url);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

test('SIGTERM: running requests finish, then the server exits 0', async () => {
  const server = await startServer();
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
  const running = client.completions.create({ prompt: 'Hello', max_tokens: 200, ignore_eos: true, temperature: 0 });
  await new Promise((r) => setTimeout(r, 200));
  const code = server.stop();
  const r = await running;
  assert.equal(r.usage.completion_tokens, 200);
  assert.equal(await code, 0);
});

test('SIGTERM with --shutdown-timeout 0: running requests are aborted, the server exits 0', async () => {
  const server = await startServer(['--shutdown-timeout', '0']);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
  const chunks = [];
  const stream = await client.completions.create({ prompt: 'Hello', max_tokens: 100000, ignore_eos: true, temperature: 0, stream: true });
  const reading = (async () => { for await (const c of stream) chunks.push(c); })();
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(await server.stop(), 0);
  await reading.catch(() => {});
  assert.ok(chunks.length > 0);
  const last = chunks.at(-1).choices[0];
  assert.equal(last.finish_reason, 'abort');
});

test('--enable-prefix-caching: the n choices of a prompt share its KV blocks', async () => {
  const server = await startServer(['--enable-prefix-caching']);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(20);
    const hits = async () => metric(await getMetrics(server.url), 'prefix_cache_hits_total');
    const before = await hits();
    const r = await client.completions.create({ prompt, max_tokens: 8, temperature: 0, n: 4 });
    const after = await hits();
    assert.equal(r.choices.length, 4);
    for (const c of r.choices) assert.equal(c.text, r.choices[0].text);
    // Choices 1..3 found the prompt's full blocks (16 tokens each) cached by choice 0.
    const fullBlocks = Math.floor((r.usage.prompt_tokens - 1) / 16);
    assert.ok(after - before >= 3 * fullBlocks * 16, `prefix-cache hits ${after - before} < ${3 * fullBlocks * 16}`);
    await waitIdle(server.url);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});
