// vLLM's "return_token_ids" through the official openai client: the prompt's ids as the engine
// saw them and the generated ids, in vLLM's shapes (completions: both in each choice; chat:
// prompt_token_ids beside choices), streamed per chunk; checked against /tokenize, usage,
// /detokenize, teacher forcing (each id is what greedy decoding picks after the ones before it)
// and the retained context a continuation built from them hits.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, getMetrics, metric } from './server_process.mjs';

let server;
let client;
const PROMPT = 'Once upon a time, in a small village,';

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  assert.equal(await server.stop(), 0);
});

async function post(path, body) {
  return (await fetch(`${server.url}${path}`, { method: 'POST', body: JSON.stringify(body) })).json();
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

test('completion: prompt_token_ids are /tokenize of the prompt, token_ids the greedy ids', async () => {
  const r = await client.completions.create({ prompt: PROMPT, max_tokens: 16, temperature: 0, return_token_ids: true });
  const c = r.choices[0];
  assert.deepEqual(c.prompt_token_ids, (await post('/tokenize', { prompt: PROMPT })).tokens);
  assert.equal(c.prompt_token_ids.length, r.usage.prompt_tokens);
  assert.equal(c.token_ids.length, r.usage.completion_tokens);
  assert.equal(c.token_ids.length, 16);
  assert.equal((await post('/detokenize', { tokens: c.token_ids })).prompt, c.text);
  // Teacher forcing: after the prompt and the first k generated ids, greedy picks id k.
  for (const k of [0, 7, 15]) {
    const next = await client.completions.create({
      prompt: [...c.prompt_token_ids, ...c.token_ids.slice(0, k)], max_tokens: 1, temperature: 0, return_token_ids: true,
      kv_retain: false,
    });
    assert.deepEqual(next.choices[0].token_ids, [c.token_ids[k]], `generated id ${k}`);
  }
  // Not asked for: not there.
  const plain = await client.completions.create({ prompt: PROMPT, max_tokens: 2, temperature: 0 });
  assert.equal(plain.choices[0].token_ids, undefined);
  assert.equal(plain.choices[0].prompt_token_ids, undefined);
});

test('completion stream: each chunk carries its ids, the prompt ids come once in the first chunk', async () => {
  const whole = await client.completions.create({ prompt: PROMPT, max_tokens: 24, temperature: 0, return_token_ids: true });
  const chunks = await collect(await client.completions.create({
    prompt: PROMPT, max_tokens: 24, temperature: 0, return_token_ids: true, stream: true, stream_options: { include_usage: true },
  }));
  const body = chunks.filter((ch) => ch.choices.length > 0);
  assert.ok(body.length > 1);
  assert.deepEqual(body[0].choices[0].prompt_token_ids, whole.choices[0].prompt_token_ids);
  for (const ch of body.slice(1)) assert.equal(ch.choices[0].prompt_token_ids, undefined);
  assert.deepEqual(body.flatMap((ch) => ch.choices[0].token_ids), whole.choices[0].token_ids);
  assert.equal(chunks.at(-1).usage.completion_tokens, whole.choices[0].token_ids.length);
});

test('several prompts and n: each choice has its own prompt ids', async () => {
  const prompts = [[5, 6, 7, 8], [9, 10, 11]];
  const r = await client.completions.create({ prompt: prompts, n: 2, max_tokens: 3, temperature: 0, return_token_ids: true });
  assert.equal(r.choices.length, 4);
  for (const c of r.choices) {
    assert.deepEqual(c.prompt_token_ids, prompts[Math.floor(c.index / 2)]);
    assert.equal(c.token_ids.length, 3);
  }
  assert.equal(r.choices.reduce((s, c) => s + c.token_ids.length, 0), r.usage.completion_tokens);
});

test('chat: prompt_token_ids beside choices (the rendered template), streamed in the role chunk', async () => {
  const messages = [{ role: 'user', content: 'Tell me a story.' }];
  const r = await client.chat.completions.create({ messages, max_tokens: 12, temperature: 0, return_token_ids: true });
  assert.equal(r.prompt_token_ids.length, r.usage.prompt_tokens);
  assert.equal(r.choices[0].token_ids.length, r.usage.completion_tokens);
  assert.equal((await post('/detokenize', { tokens: r.choices[0].token_ids })).prompt.startsWith(r.choices[0].message.content), true);
  const chunks = await collect(await client.chat.completions.create({
    messages, max_tokens: 12, temperature: 0, return_token_ids: true, stream: true,
  }));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.deepEqual(chunks[0].prompt_token_ids, r.prompt_token_ids);
  for (const ch of chunks.slice(1)) assert.equal(ch.prompt_token_ids, undefined);
  assert.deepEqual(chunks.slice(1).flatMap((ch) => ch.choices[0].token_ids), r.choices[0].token_ids);
});

test('a continuation built from the returned ids hits the retained context of the answer', async () => {
  const first = await client.completions.create({ prompt: PROMPT, max_tokens: 10, temperature: 0, return_token_ids: true });
  const { prompt_token_ids: prompt, token_ids: answer } = first.choices[0];
  const before = await getMetrics(server.url);
  await client.completions.create({ prompt: [...prompt, ...answer, 11, 12, 13], max_tokens: 2, temperature: 0 });
  const after = await getMetrics(server.url);
  assert.equal(metric(after, 'retained_hits_total') - metric(before, 'retained_hits_total'), 1);
  // The history up to the answer's last token (whose KV was never computed).
  assert.equal(metric(after, 'retained_hit_tokens_total') - metric(before, 'retained_hit_tokens_total'), prompt.length + answer.length - 1);
});

test('return_token_ids must be a boolean: 400 naming the field', async () => {
  for (const value of ['yes', 1, [true], { on: true }]) {
    await assert.rejects(client.completions.create({ prompt: PROMPT, max_tokens: 2, return_token_ids: value }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError);
      assert.equal(e.param, 'return_token_ids');
      assert.match(e.message, /'return_token_ids' must be true or false/);
      return true;
    });
  }
  await assert.rejects(client.chat.completions.create({
    messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, return_token_ids: 'true', stream: true,
  }), (e) => { assert.equal(e.status, 400); assert.equal(e.param, 'return_token_ids'); return true; });
  // null is the default (off).
  const r = await client.completions.create({ prompt: PROMPT, max_tokens: 2, return_token_ids: null });
  assert.equal(r.choices[0].token_ids, undefined);
});
