// `origami bench serve` against a real server with the tiny model: the single-turn workload
// counts every request, and --multiturn runs every turn of every conversation in order, each
// prompt the whole conversation so far (so with prefix caching, later turns hit the cache).
// With --answer-ids returned (the default) the answers go back as the generated ids, so every
// later turn continues its conversation's retained context; --no-retain-contexts is the control.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { BIN, startServer } from './server_process.mjs';

const conversations = 3, turns = 3, docLen = 64, questionLen = 8, outputLen = 4;
const multiturnFlags = (output) => ['--multiturn', '--conversations', String(conversations), '--turns', String(turns),
                                    '--doc-len', String(docLen), '--question-len', String(questionLen),
                                    '--output-len', String(output), '--think-time', '0.05', '--max-concurrency', '2'];
const multiturnArgs = multiturnFlags(outputLen);

function benchServe(url, args) {
  const out = execFileSync(BIN, ['bench', 'serve', '--base-url', url, '--json', '--quiet', ...args],
                           { encoding: 'utf8', timeout: 120000 });
  return JSON.parse(out);
}

test('bench serve: single-turn and multi-turn workloads', { timeout: 300000 }, async () => {
  const server = await startServer(['--enable-prefix-caching']);
  try {
    const single = benchServe(server.url, ['--num-prompts', '3', '--input-len', '16', '--output-len', '4']);
    assert.equal(single.completed, 3, JSON.stringify(single));
    assert.equal(single.failed, 0);
    assert.equal(single.output_tokens, 12);
    assert.equal(single.temperature, 0);
    // --temperature: every request samples (the server accepts it; the report names it).
    const sampled = benchServe(server.url, ['--num-prompts', '3', '--input-len', '16', '--output-len', '4',
                                            '--temperature', '0.8']);
    assert.equal(sampled.completed, 3, JSON.stringify(sampled));
    assert.equal(sampled.failed, 0);
    assert.equal(sampled.temperature, 0.8);
    assert.throws(() => benchServe(server.url, ['--num-prompts', '1', '--temperature', '-1']), /--temperature must be/);

    const r = benchServe(server.url, [...multiturnArgs, '--answer-ids', 'retokenized']);
    assert.equal(r.answer_ids, 'retokenized');
    assert.ok(Number.isInteger(r.answers_retokenized_differently));
    assert.equal(r.workload, 'multiturn');
    assert.equal(r.completed, conversations * turns, r.first_error);
    assert.equal(r.failed, 0);
    assert.equal(r.not_run, 0);
    assert.equal(r.output_tokens, conversations * turns * outputLen);
    assert.equal(r.per_turn.length, turns);
    for (let t = 0; t < turns; ++t) {
      assert.equal(r.per_turn[t].turn, t + 1);
      assert.equal(r.per_turn[t].completed, conversations);
      assert.ok(r.per_turn[t].mean_ttft_ms > 0);
      assert.ok(r.per_turn[t].p99_ttft_ms >= r.per_turn[t].median_ttft_ms);
    }
    // Turn 1 is the document and a question; each later turn adds the previous answer (as the
    // server tokenizes its text) and the next question.
    assert.equal(r.per_turn[0].mean_prompt_tokens, docLen + questionLen);
    for (let t = 1; t < turns; ++t) assert.ok(r.per_turn[t].mean_prompt_tokens > r.per_turn[t - 1].mean_prompt_tokens + questionLen);
    // Every later turn begins with its previous turn's prompt (4 full blocks of 16 at least),
    // and the three conversations share one document. Those tokens are served by the prefix
    // cache or, where the answer retokenized to its generated ids, by the retained context of
    // the previous turn (which is then looked up first), so the two counters add up.
    const m = r.server_metrics;
    assert.ok(m.prefix_cache_hits_total + m.retained_hit_tokens_total >= conversations * (turns - 1) * 64, JSON.stringify(m));
    assert.ok(r.mean_tpot_ms > 0);
    assert.ok(r.output_tokens_per_second > 0);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

// Random weights (--dummy-weights) generate text that often does not tokenize back to the same
// ids (with 32-token answers, about one in six here): the case where only returned ids keep the
// history exact.
test('bench serve --multiturn --answer-ids returned: every later turn continues a retained context', { timeout: 300000 }, async () => {
  const answerLen = 32;
  // Turn t's (1-based) prompt when each answer goes back as its generated ids.
  const promptLen = (t) => docLen + t * questionLen + (t - 1) * answerLen;
  for (const retain of [true, false]) {
    const server = await startServer(['--dummy-weights', ...(retain ? [] : ['--no-retain-contexts'])]);
    try {
      const r = benchServe(server.url, [...multiturnFlags(answerLen), '--answer-ids', 'returned', '--dataset-seed', '11']);
      assert.equal(r.answer_ids, 'returned');
      assert.equal(r.answers_retokenized_differently, undefined, 'only retokenized answers can differ');
      assert.equal(r.completed, conversations * turns, r.first_error);
      assert.equal(r.failed, 0);
      // The history is exactly document, questions and generated ids.
      for (let t = 1; t <= turns; ++t) assert.equal(r.per_turn[t - 1].mean_prompt_tokens, promptLen(t));
      const m = r.server_metrics;
      if (!retain) {
        assert.equal(m.retained_hits_total ?? 0, 0, JSON.stringify(m));
        continue;
      }
      // Turn t >= 2 begins with turn t-1's whole history: its prompt and all but the last
      // generated id (whose KV was never computed).
      assert.ok(m.retained_hits_total >= conversations * (turns - 1), JSON.stringify(m));
      let served = 0;
      for (let t = 2; t <= turns; ++t) served += conversations * (promptLen(t - 1) + answerLen - 1);
      assert.ok(m.retained_hit_tokens_total >= served, JSON.stringify(m));
    } finally {
      assert.equal(await server.stop(), 0);
    }
  }
});
