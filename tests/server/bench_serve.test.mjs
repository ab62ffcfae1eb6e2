// `origami bench serve` against a real server with the tiny model: the single-turn workload
// counts every request, and --multiturn runs every turn of every conversation in order, each
// prompt the whole conversation so far (so with prefix caching, later turns hit the cache).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { BIN, startServer } from './server_process.mjs';

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

    const conversations = 3, turns = 3, docLen = 64, questionLen = 8, outputLen = 4;
    const r = benchServe(server.url, ['--multiturn', '--conversations', String(conversations), '--turns', String(turns),
                                      '--doc-len', String(docLen), '--question-len', String(questionLen),
                                      '--output-len', String(outputLen), '--think-time', '0.05', '--max-concurrency', '2']);
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
    // and the three conversations share one document.
    assert.ok(r.server_metrics.prefix_cache_hits_total >= conversations * (turns - 1) * 64, JSON.stringify(r.server_metrics));
    assert.ok(r.mean_tpot_ms > 0);
    assert.ok(r.output_tokens_per_second > 0);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});
