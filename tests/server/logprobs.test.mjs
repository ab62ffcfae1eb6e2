// Log-probabilities through the official openai client: completions' `logprobs: N` and chat's
// `logprobs: true` + `top_logprobs: N`, streaming and not, with n > 1; the values are the
// engine's (`origami generate --logprobs`, the raw model distribution before temperature), the
// streamed chunks carry exactly the non-streamed entries, and invalid values are 400s.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, generateWithLogprobs } from './server_process.mjs';

let server;
let client;
const PROMPT = 'Once upon a time, in a small village,';
const MESSAGES = [{ role: 'user', content: 'Tell me a story.' }];
const TOKENS = 12;

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

const close = (a, b) => Math.abs(a - b) <= 1e-4 * Math.max(1, Math.abs(b));

// The reference's top entries as {token_id: logprob}; the server shows token strings, so the
// comparison goes through the values in order.
function assertTopMatches(gotValues, reference, what) {
  assert.equal(gotValues.length, reference.length, `${what}: number of alternatives`);
  for (let j = 0; j < reference.length; ++j)
    assert.ok(close(gotValues[j], reference[j].logprob), `${what} rank ${j}: ${gotValues[j]} vs ${reference[j].logprob}`);
  for (let j = 1; j < gotValues.length; ++j) assert.ok(gotValues[j] <= gotValues[j - 1], `${what}: descending`);
}

test('completions logprobs: N equal the engine\'s, and greedy tokens are the most likely', async () => {
  const ref = generateWithLogprobs({ prompt: PROMPT, max_tokens: TOKENS, temperature: 0 }, 3);
  const r = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: TOKENS, temperature: 0, logprobs: 3 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, TOKENS);
  assert.equal(lp.tokens.join(''), r.choices[0].text, 'the tokens spell the text');
  assert.equal(lp.text_offset[0], 0);
  for (let i = 1; i < TOKENS; ++i) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + [...lp.tokens[i - 1]].length);
  for (let i = 0; i < TOKENS; ++i) {
    assert.ok(close(lp.token_logprobs[i], ref.logprobs[i].logprob), `token ${i}`);
    assert.ok(lp.token_logprobs[i] <= 0);
    // The dict holds the top 3 and the chosen token (one of them when greedy).
    const values = Object.values(lp.top_logprobs[i]).sort((a, b) => b - a);
    assert.equal(values.length, 3);
    assertTopMatches(values, ref.logprobs[i].top_logprobs, `token ${i}`);
    assert.equal(lp.top_logprobs[i][lp.tokens[i]], lp.token_logprobs[i]);
    assert.equal(Math.max(...values), lp.token_logprobs[i], 'greedy picks the most likely token');
  }
  // A sampled token reports its raw log-probability, not the tempered, top-k-renormalised one.
  const raw = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 1, temperature: 0, logprobs: 20 });
  const rawTop = raw.choices[0].logprobs.top_logprobs[0];
  for (const seed of [1, 2, 3, 4]) {
    const hot = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 1, temperature: 1.7, top_k: 20, seed, logprobs: 0 });
    const hl = hot.choices[0].logprobs;
    assert.equal(Object.keys(hl.top_logprobs[0]).length, 1, 'logprobs: 0 lists only the chosen token');
    assert.ok(hl.tokens[0] in rawTop, 'top_k 20 samples among the 20 most likely');
    assert.ok(close(hl.token_logprobs[0], rawTop[hl.tokens[0]]), `seed ${seed}: ${hl.token_logprobs[0]} vs raw ${rawTop[hl.tokens[0]]}`);
  }
});

test('streamed completion logprobs add up to the non-streamed ones, with n = 2', async () => {
  const body = { model: 'tiny', prompt: PROMPT, max_tokens: TOKENS, temperature: 0, logprobs: 2, n: 2 };
  const whole = await client.completions.create(body);
  const chunks = await collect(await client.completions.create({ ...body, stream: true }));
  for (const index of [0, 1]) {
    const mine = chunks.filter((c) => c.choices.length && c.choices[0].index === index);
    const tokens = mine.flatMap((c) => c.choices[0].logprobs?.tokens ?? []);
    const values = mine.flatMap((c) => c.choices[0].logprobs?.token_logprobs ?? []);
    const offsets = mine.flatMap((c) => c.choices[0].logprobs?.text_offset ?? []);
    const want = whole.choices.find((c) => c.index === index).logprobs;
    assert.deepEqual(tokens, want.tokens, `choice ${index} tokens`);
    assert.deepEqual(values, want.token_logprobs, `choice ${index} values`);
    assert.deepEqual(offsets, want.text_offset, `choice ${index} offsets`);
    for (const c of mine) if (c.choices[0].logprobs) assert.equal(c.choices[0].logprobs.tokens.join(''), c.choices[0].text);
  }
});

test('chat logprobs: content entries with bytes and exactly top_logprobs alternatives', async () => {
  const ref = generateWithLogprobs({ messages: MESSAGES, max_tokens: TOKENS, temperature: 0 }, 4);
  const r = await client.chat.completions.create({
    model: 'tiny', messages: MESSAGES, max_tokens: TOKENS, temperature: 0, logprobs: true, top_logprobs: 4,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  assert.equal(content.length, ref.logprobs.length);
  for (let i = 0; i < content.length; ++i) {
    const e = content[i];
    assert.ok(close(e.logprob, ref.logprobs[i].logprob), `token ${i}`);
    if (!e.token.includes('\uFFFD')) assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
    else assert.ok(e.bytes.length > 0, 'a partial character keeps its raw bytes');
    assert.equal(e.top_logprobs.length, 4);
    assertTopMatches(e.top_logprobs.map((t) => t.logprob), ref.logprobs[i].top_logprobs, `token ${i}`);
    assert.equal(e.top_logprobs[0].token, e.token, 'greedy picks the most likely token');
    for (const t of e.top_logprobs) assert.ok(Array.isArray(t.bytes));
  }
  // logprobs without top_logprobs: no alternatives; no logprobs: null.
  const bare = await client.chat.completions.create({ model: 'tiny', messages: MESSAGES, max_tokens: 3, temperature: 0, logprobs: true });
  assert.ok(bare.choices[0].logprobs.content.every((e) => e.top_logprobs.length === 0));
  const none = await client.chat.completions.create({ model: 'tiny', messages: MESSAGES, max_tokens: 3, temperature: 0 });
  assert.equal(none.choices[0].logprobs, null);
});

test('streamed chat logprobs add up to the non-streamed content', async () => {
  const body = { model: 'tiny', messages: MESSAGES, max_tokens: TOKENS, temperature: 0, logprobs: true, top_logprobs: 2 };
  const whole = await client.chat.completions.create(body);
  const chunks = await collect(await client.chat.completions.create({ ...body, stream: true }));
  const content = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
  assert.deepEqual(content, whole.choices[0].logprobs.content);
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, whole.choices[0].message.content);
});

test('invalid logprobs values are 400s in OpenAI\'s shape, streaming or not', async () => {
  const bad = [
    [client.completions, { prompt: PROMPT, logprobs: -1 }, 'logprobs'],
    [client.completions, { prompt: PROMPT, logprobs: 21 }, 'logprobs'],
    [client.completions, { prompt: PROMPT, logprobs: 2.5, n: 2 }, 'logprobs'],
    [client.completions, { prompt: PROMPT, logprobs: 30, stream: true }, 'logprobs'],
    [client.completions, { prompt: PROMPT, top_logprobs: 2 }, 'top_logprobs'],
    [client.chat.completions, { messages: MESSAGES, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    [client.chat.completions, { messages: MESSAGES, logprobs: true, top_logprobs: -1, stream: true }, 'top_logprobs'],
    [client.chat.completions, { messages: MESSAGES, top_logprobs: 3, n: 2 }, 'top_logprobs'],
    [client.chat.completions, { messages: MESSAGES, logprobs: 5 }, 'logprobs'],
  ];
  for (const [api, body, param] of bad) {
    await assert.rejects(api.create({ model: 'tiny', max_tokens: 2, ...body }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, JSON.stringify(body));
      assert.equal(e.status, 400);
      assert.equal(e.param, param, JSON.stringify(body));
      assert.equal(e.type, 'invalid_request_error');
      return true;
    });
  }
});
