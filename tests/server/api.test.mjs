// `origami serve` through the official openai client: completions and chat, streaming and
// not, n, stop, usage, typed errors, tokenize/detokenize, metrics, disconnects, shutdown.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, generate, getMetrics, metric, waitIdle } from './server_process.mjs';

let server;
let client;
const PROMPT = 'Once upon a time, in a small village,';

before(async () => {
  server = await startServer(['--served-model-name', 'tiny']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  assert.equal(await server.stop(), 0, 'the server exits 0 on SIGTERM');
});

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

test('GET /v1/models lists the served model', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['tiny']);
  assert.equal(models.data[0].object, 'model');
});

test('greedy completion equals origami generate, token for token', async () => {
  const reference = generate(PROMPT, 24);
  const r = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 24, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.model, 'tiny');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, reference);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 24);
  // The same tokens: the text's ids after the prompt's are what 24 greedy steps produced.
  const tok = await (await fetch(`${server.url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: PROMPT }) })).json();
  assert.equal(r.usage.prompt_tokens, tok.count);
  assert.equal(r.usage.total_tokens, tok.count + 24);
});

test('greedy chat equals origami generate --chat', async () => {
  const reference = generate('Tell me a story.', 20, { chat: true });
  const r = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 20, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, reference);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  // Content as a list of text parts renders the same prompt.
  const parts = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me a story.' }] }], max_completion_tokens: 20, temperature: 0,
  });
  assert.equal(parts.choices[0].message.content, reference);
  assert.equal(parts.usage.prompt_tokens, r.usage.prompt_tokens);
});

test('streamed completion: the chunks add up to the non-streamed text, then usage', async () => {
  const whole = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 30, temperature: 0 });
  const chunks = await collect(await client.completions.create({
    model: 'tiny', prompt: PROMPT, max_tokens: 30, temperature: 0, stream: true, stream_options: { include_usage: true },
  }));
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, whole.usage);
  const body = chunks.slice(0, -1);
  assert.ok(body.length > 1, 'several chunks');
  for (const c of body) { assert.equal(c.object, 'text_completion'); assert.equal(c.usage, null); assert.equal(c.id, body[0].id); }
  assert.equal(body.map((c) => c.choices[0].text).join(''), whole.choices[0].text);
  assert.equal(body.at(-1).choices[0].finish_reason, 'length');
  for (const c of body.slice(0, -1)) assert.equal(c.choices[0].finish_reason, null);
});

test('streamed chat: role first, deltas add up to the message, no usage unless asked', async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hello there!' }];
  const whole = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 25, temperature: 0 });
  const chunks = await collect(await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 25, temperature: 0, stream: true }));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  for (const c of chunks) { assert.equal(c.object, 'chat.completion.chunk'); assert.equal(c.usage, undefined); }
  assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), whole.choices[0].message.content);
  assert.equal(chunks.at(-1).choices[0].finish_reason, whole.choices[0].finish_reason);
});

test('n = 2: greedy choices agree; sampled choices are both returned with their index', async () => {
  const greedy = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 12, temperature: 0, n: 2 });
  assert.equal(greedy.choices.length, 2);
  assert.deepEqual(greedy.choices.map((c) => c.index), [0, 1]);
  assert.equal(greedy.choices[0].text, greedy.choices[1].text);
  assert.equal(greedy.usage.completion_tokens, 24);
  const sampled = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 12, temperature: 1.0, seed: 7, n: 2,
  });
  assert.deepEqual(sampled.choices.map((c) => c.index), [0, 1]);
  const again = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 12, temperature: 1.0, seed: 7, n: 2,
  });
  assert.deepEqual(again.choices.map((c) => c.message.content), sampled.choices.map((c) => c.message.content), 'seeded: reproducible');
  const streamed = await collect(await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 12, temperature: 0, n: 2, stream: true }));
  for (const index of [0, 1]) {
    const text = streamed.filter((c) => c.choices[0]?.index === index).map((c) => c.choices[0].text).join('');
    assert.equal(text, greedy.choices[index].text);
  }
});

test('a list of prompts gives one choice per prompt, in order', async () => {
  const prompts = [PROMPT, 'The capital of France is'];
  const r = await client.completions.create({ model: 'tiny', prompt: prompts, max_tokens: 8, temperature: 0 });
  assert.equal(r.choices.length, 2);
  for (let i = 0; i < 2; ++i) {
    const alone = await client.completions.create({ model: 'tiny', prompt: prompts[i], max_tokens: 8, temperature: 0 });
    assert.equal(r.choices[i].text, alone.choices[0].text);
  }
  // Token ids as the prompt.
  const tok = await (await fetch(`${server.url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: PROMPT }) })).json();
  const byIds = await client.completions.create({ model: 'tiny', prompt: tok.tokens, max_tokens: 8, temperature: 0 });
  assert.equal(byIds.choices[0].text, r.choices[0].text);
});

test('stop strings end the text before them and are never partly streamed', async () => {
  const whole = (await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 40, temperature: 0 })).choices[0].text;
  const stop = whole.slice(10, 14);
  assert.equal(stop.length, 4);
  const expected = whole.slice(0, whole.indexOf(stop));
  const r = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 40, temperature: 0, stop: [stop, 'zzzz'] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const chunks = await collect(await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 40, temperature: 0, stop, stream: true }));
  let sent = '';
  for (const c of chunks) {
    sent += c.choices[0].text;
    assert.ok(expected.startsWith(sent), `streamed text ${JSON.stringify(sent)} goes beyond the stop`);
  }
  assert.equal(sent, expected);
});

test('streamed text never splits a UTF-8 character', async () => {
  // Multi-byte characters are several byte-level tokens; forcing them as the output makes the
  // stream cross every character boundary.
  const text = ' 日本語 ✓ café — ok 🚀!';
  const tok = await (await fetch(`${server.url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: text, add_special_tokens: false }) })).json();
  assert.ok(tok.count > [...text].length, 'some characters take several tokens');
  const chunks = await collect(await client.completions.create({
    model: 'tiny', prompt: PROMPT, max_tokens: tok.count, forced_output_tokens: tok.tokens, stream: true,
  }));
  const pieces = chunks.map((c) => c.choices[0].text);
  for (const p of pieces) assert.ok(!p.includes('\uFFFD'), `a chunk holds a broken character: ${JSON.stringify(pieces)}`);
  assert.equal(pieces.join(''), text);
  assert.ok(pieces.filter((p) => p.length > 0).length > 3, 'streamed in several pieces');
});

test('errors arrive as the client\'s typed errors', async () => {
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 0 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.equal(e.status, 400); assert.match(e.message, /max_tokens/); return true;
  });
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: PROMPT, temperature: -1 }), OpenAI.BadRequestError);
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: PROMPT, kv_policy: 'no-such-policy' }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.match(e.message, /no-such-policy/); return true;
  });
  await assert.rejects(client.completions.create({ model: 'other', prompt: PROMPT }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError); assert.equal(e.code, 'model_not_found'); return true;
  });
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'word '.repeat(5000), max_tokens: 4 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.match(e.message, /maximum context length/); return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [] }), OpenAI.BadRequestError);
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: PROMPT, logprobs: 21 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.equal(e.param, 'logprobs'); return true;
  });
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: PROMPT, n: 0 }), OpenAI.BadRequestError);
  // Streaming requests fail the same way, before any event.
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: PROMPT, top_p: 2, stream: true }), OpenAI.BadRequestError);
  // Raw HTTP: malformed JSON, an unknown route.
  let r = await fetch(`${server.url}/v1/completions`, { method: 'POST', body: '{"prompt": ' });
  assert.equal(r.status, 400);
  assert.equal((await r.json()).error.type, 'invalid_request_error');
  r = await fetch(`${server.url}/v1/nothing`);
  assert.equal(r.status, 404);
  assert.ok((await r.json()).error.message);
  // The server is unharmed.
  const ok = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 4, temperature: 0 });
  assert.equal(ok.usage.completion_tokens, 4);
});

test('tokenize and detokenize round-trip', async () => {
  const text = 'Hello, world! Ünïcødé ✓';
  const tok = await (await fetch(`${server.url}/tokenize`, { method: 'POST', body: JSON.stringify({ model: 'tiny', prompt: text, add_special_tokens: false }) })).json();
  assert.equal(tok.count, tok.tokens.length);
  assert.ok(tok.max_model_len > 0);
  const detok = await (await fetch(`${server.url}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: tok.tokens }) })).json();
  assert.equal(detok.prompt, text);
  const bad = await fetch(`${server.url}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: [-5] }) });
  assert.equal(bad.status, 400);
});

test('a client that disconnects mid-stream is aborted and its KV blocks freed', async () => {
  const before = metric(await getMetrics(server.url), 'request_success_total', 'finished_reason="abort"');
  const controller = new AbortController();
  const stream = await client.completions.create(
    { model: 'tiny', prompt: PROMPT, max_tokens: 2000, temperature: 0, ignore_eos: true, stream: true },
    { signal: controller.signal });
  let n = 0;
  try {
    for await (const _ of stream) { if (++n === 3) controller.abort(); }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError, `${e}`);
  }
  assert.equal(n, 3);
  const m = await waitIdle(server.url);
  assert.equal(metric(m, 'request_success_total', 'finished_reason="abort"'), before + 1);
  assert.ok(metric(m, 'generation_tokens_total') > 0);
});

test('/metrics speaks Prometheus with origami: names', async () => {
  const m = await waitIdle(server.url);
  for (const name of ['num_requests_running', 'num_requests_waiting', 'kv_blocks_used', 'kv_blocks_total', 'kv_cache_usage_perc',
    'prefix_cache_hit_rate', 'num_preemptions_total', 'num_compressions_total', 'evicted_tokens_total', 'compression_seconds_total',
    'prompt_tokens_total', 'generation_tokens_total', 'time_to_first_token_seconds_count', 'time_per_output_token_seconds_count',
    'e2e_request_latency_seconds_count']) metric(m, name);
  assert.match(m, /# TYPE origami:time_to_first_token_seconds histogram/);
  assert.ok(metric(m, 'kv_blocks_total') > 0);
  assert.ok(metric(m, 'request_success_total', 'finished_reason="length"') > 0);
  assert.ok(metric(m, 'e2e_request_latency_seconds_count') > 0);
  assert.match(m, /origami:e2e_request_latency_seconds_bucket\{model_name="tiny",le="\+Inf"\} \d+/);
  // Steps launched before the last one's tokens were known: only under --async-scheduling.
  const pipelined = metric(m, 'num_pipelined_steps_total');
  if ((process.env.ORIGAMI_SERVE_ARGS ?? '').includes('--async-scheduling')) assert.ok(pipelined > 0, 'steps were pipelined');
  else assert.equal(pipelined, 0);
});

test('/health answers 200', async () => {
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
});
