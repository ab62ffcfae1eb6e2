// Sampling controls through the official openai client: penalties, min_tokens and logit_bias
// are honoured (they change greedy output), and what origami does not know is refused by name:
// a typo with a did-you-mean, an unsupported OpenAI field at a non-default value.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server_process.mjs';

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

const greedy = (extra) => client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 32, temperature: 0, ...extra });

test('penalties are accepted and change the greedy completion', async () => {
  const plain = await greedy({});
  for (const extra of [{ repetition_penalty: 1.5 }, { frequency_penalty: 1.5 }, { presence_penalty: 2 }]) {
    const r = await greedy(extra);
    assert.equal(r.usage.completion_tokens, 32);
    assert.notEqual(r.choices[0].text, plain.choices[0].text, JSON.stringify(extra));
    // Deterministic: the same request gives the same text.
    assert.equal((await greedy(extra)).choices[0].text, r.choices[0].text);
  }
  // Zero penalties are the plain decode.
  const zero = await greedy({ frequency_penalty: 0, presence_penalty: 0, repetition_penalty: 1 });
  assert.equal(zero.choices[0].text, plain.choices[0].text);
  // Chat takes them too.
  const chat = (extra) => client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 24, temperature: 0, ...extra,
  });
  const chatPlain = await chat({});
  const chatPenalized = await chat({ frequency_penalty: 2, presence_penalty: 2 });
  assert.notEqual(chatPenalized.choices[0].message.content, chatPlain.choices[0].message.content);
});

test('logit_bias forces a token and min_tokens delays the end', async () => {
  const tok = await (await fetch(`${server.url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: ' village' }) })).json();
  const id = tok.tokens[tok.tokens.length - 1];
  const r = await greedy({ max_tokens: 6, logit_bias: { [id]: 100 } });
  const detok = await (await fetch(`${server.url}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: Array(6).fill(id) }) })).json();
  assert.equal(r.choices[0].text, detok.prompt);
  // A stop string met at once ends the request; min_tokens holds it off, as in vLLM.
  const word = (await (await fetch(`${server.url}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: [id] }) })).json()).prompt;
  const stopped = await greedy({ max_tokens: 12, logit_bias: { [id]: 100 }, stop: [word] });
  assert.equal(stopped.usage.completion_tokens, 1);
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  const held = await greedy({ max_tokens: 12, logit_bias: { [id]: 100 }, stop: [word], min_tokens: 4 });
  assert.equal(held.usage.completion_tokens, 5);
  assert.equal(held.choices[0].finish_reason, 'stop');
  await assert.rejects(greedy({ logit_bias: { 99999999: 1 } }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.match(e.message, /logit_bias/); return true;
  });
  await assert.rejects(greedy({ logit_bias: { [id]: 101 } }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.match(e.message, /logit_bias/); return true;
  });
  await assert.rejects(greedy({ presence_penalty: 2.5 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.match(e.message, /presence_penalty/); return true;
  });
  await assert.rejects(greedy({ min_tokens: 40 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError); assert.match(e.message, /min_tokens/); return true;
  });
});

test('unknown fields are refused with a did-you-mean; unsupported ones by name', async () => {
  await assert.rejects(greedy({ temprature: 0.5 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.match(e.message, /unknown field 'temprature' \(did you mean 'temperature'\?\)/);
    assert.equal(e.param, 'temprature');
    return true;
  });
  await assert.rejects(greedy({ max_tokns: 5 }), /did you mean 'max_tokens'/);
  await assert.rejects(
    client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, response_format: { type: 'json_object' },
    }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError); assert.equal(e.param, 'response_format');
      assert.match(e.message, /'response_format' is not supported/); return true;
    });
  await assert.rejects(
    client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, tool_choice: 'required',
      tools: [{ type: 'function', function: { name: 'f', parameters: {} } }],
    }),
    (e) => { assert.ok(e instanceof OpenAI.BadRequestError); assert.match(e.param, /^tool/); return true; });
  // Defaults and harmless fields pass.
  const ok = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0,
    response_format: { type: 'text' }, user: 'someone', tool_choice: 'none', metadata: { k: 'v' }, store: false,
  });
  assert.equal(ok.choices.length, 1);
});
