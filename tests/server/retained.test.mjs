// Retained contexts through the server (on by default): a document retained by a request with
// "max_tokens": 0 and "kv_retain": true, then a question continuing it (a hit: fewer prompt tokens
// prefilled); a chat's second turn; every greedy text equal to a fresh server's without retained
// contexts (--kv-policy full). "kv_retain": false opts a request out.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, getMetrics, metric } from './server_process.mjs';

const DOC = 'The lighthouse keeper counted the ships that passed the northern rocks every night. ' +
  'The secret number of the blue heron is 4821. Winds came from the west, and the keeper wrote each storm into a book.';
const QUESTION = ' Question: what is the secret number of the blue heron? Answer: it is';

async function tokenize(url, prompt) {
  return (await (await fetch(`${url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt }) })).json()).tokens;
}

test('a retained document is continued by its question; texts equal a fresh server without retained contexts', async () => {
  const server = await startServer();
  const fresh = await startServer(['--no-retain-contexts']);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const freshClient = new OpenAI({ baseURL: `${fresh.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const doc = await tokenize(server.url, DOC);
    const question = (await tokenize(server.url, QUESTION)).filter((_, i, a) => i > 0 || a[0] !== doc[0]);

    const retained = await client.completions.create({ prompt: doc, max_tokens: 0, kv_retain: true, temperature: 0 });
    assert.equal(retained.choices[0].text, '');
    assert.equal(retained.choices[0].finish_reason, 'length');
    assert.equal(retained.usage.completion_tokens, 0);

    const before = await getMetrics(server.url);
    const prompt = [...doc, ...question];
    const asked = await client.completions.create({ prompt, max_tokens: 12, temperature: 0 });
    const after = await getMetrics(server.url);
    assert.equal(metric(after, 'retained_hits_total') - metric(before, 'retained_hits_total'), 1);
    assert.equal(metric(after, 'retained_hit_tokens_total') - metric(before, 'retained_hit_tokens_total'), doc.length);
    assert.equal(metric(after, 'prompt_tokens_total') - metric(before, 'prompt_tokens_total'), question.length);
    assert.ok(metric(after, 'retained_contexts') >= 1);
    assert.ok(metric(after, 'retained_kv_blocks') >= 1);

    const reference = await freshClient.completions.create({ prompt, max_tokens: 12, temperature: 0 });
    assert.equal(asked.choices[0].text, reference.choices[0].text);
    assert.equal(metric(await getMetrics(fresh.url), 'retained_hits_total'), 0);

    // Opted out: computed from scratch, the same text.
    const optedOut = await client.completions.create({ prompt, max_tokens: 12, temperature: 0, kv_retain: false });
    assert.equal(optedOut.choices[0].text, reference.choices[0].text);
    assert.equal(metric(await getMetrics(server.url), 'retained_hits_total'), metric(after, 'retained_hits_total'));

    // A chat's second turn: whatever it finds retained, its text is the fresh server's.
    const first = [{ role: 'user', content: DOC + ' Tell me about the keeper.' }];
    const turn1 = await client.chat.completions.create({ messages: first, max_tokens: 16, temperature: 0 });
    const second = [...first, { role: 'assistant', content: turn1.choices[0].message.content }, { role: 'user', content: 'And the heron?' }];
    const turn2 = await client.chat.completions.create({ messages: second, max_tokens: 16, temperature: 0 });
    const ref2 = await freshClient.chat.completions.create({ messages: second, max_tokens: 16, temperature: 0 });
    assert.equal(turn2.choices[0].message.content, ref2.choices[0].message.content);

    // Retaining needs retained contexts.
    await assert.rejects(freshClient.completions.create({ prompt: doc, max_tokens: 0, kv_retain: true }),
      (e) => { assert.equal(e.status, 400); assert.match(e.message, /kv_retain/); return true; });
  } finally {
    assert.equal(await server.stop(), 0);
    assert.equal(await fresh.stop(), 0);
  }
});
