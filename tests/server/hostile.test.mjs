// `origami serve` against hostile bodies (docs/reliability.md, "JSON depth and number bounds"):
// JSON nested 10^6 levels deep in every field of every endpoint, numbers at every integer
// boundary in every numeric field, and malformed chat content parts. Each is a 400 with a
// message naming what is wrong (or, for a number the engine can hold, a success); the process
// never crashes nor drops the connection, and still completes a normal request afterwards.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './server_process.mjs';

let server;
const DEPTH = 1000000;
// Built once: 2 MB of arrays, and 6 MB of objects ({"a":{"a":...}}), under the 8 MiB body limit.
const DEEP = '['.repeat(DEPTH) + '1' + ']'.repeat(DEPTH);
const DEEP_OBJECT = '{"a":'.repeat(DEPTH) + '1' + '}'.repeat(DEPTH);

before(async () => {
  // A short context keeps every accepted request (max_tokens up to 2^31 - 1) a few tokens long.
  server = await startServer(['--max-model-len', '48']);
});

after(async () => {
  assert.equal(await server.stop(), 0, 'the server exits 0 on SIGTERM');
});

// POSTs a raw body; resolves with the status and the parsed JSON answer (a dropped connection
// rejects, failing the test).
async function post(path, body) {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', body, headers: { 'content-type': 'application/json' } });
  const text = await r.text();
  let json;
  try { json = JSON.parse(text); } catch { assert.fail(`${path}: answer is not JSON (${r.status}): ${text.slice(0, 200)}`); }
  return { status: r.status, json };
}

async function expectNormalCompletion() {
  assert.equal(server.proc.exitCode, null, 'the server is still running');
  const ok = await post('/v1/completions', JSON.stringify({ prompt: 'Once upon a time', max_tokens: 3, temperature: 0, ignore_eos: true }));
  assert.equal(ok.status, 200, JSON.stringify(ok.json));
  assert.equal(ok.json.usage.completion_tokens, 3);
}

// Bodies whose `slot` is replaced by the deep value: every field of every endpoint, and inside
// messages, content parts, chat_template_kwargs and kv_policy_options.
const COMPLETION_FIELDS = ['prompt', 'model', 'n', 'best_of', 'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'seed',
  'stop', 'stop_token_ids', 'ignore_eos', 'include_stop_str_in_output', 'logprobs', 'echo', 'suffix', 'logit_bias',
  'presence_penalty', 'frequency_penalty', 'stream', 'stream_options', 'user', 'kv_policy', 'kv_budget',
  'kv_policy_options', 'kv_head_budgets', 'forced_output_tokens', 'return_forced_logprobs', 'unknown_field'];
const CHAT_FIELDS = ['messages', 'model', 'n', 'max_tokens', 'max_completion_tokens', 'temperature', 'seed', 'stop',
  'logprobs', 'top_logprobs', 'tools', 'tool_choice', 'response_format', 'chat_template_kwargs', 'kv_budget',
  'kv_policy_options'];
function deepBodies(deep) {
  const SLOT = '"@@SLOT@@"';
  const shapes = [];
  for (const f of COMPLETION_FIELDS) {
    const body = f === 'prompt' ? { prompt: '@@SLOT@@' } : { prompt: 'hi', max_tokens: 2, [f]: '@@SLOT@@' };
    shapes.push(['/v1/completions', f, body]);
  }
  shapes.push(['/v1/completions', 'prompt[0]', { prompt: ['@@SLOT@@'] }]);
  shapes.push(['/v1/completions', 'kv_policy_options.window', { prompt: 'hi', kv_policy: 'zipage', kv_policy_options: { window: '@@SLOT@@' } }]);
  const msg = [{ role: 'user', content: 'hi' }];
  for (const f of CHAT_FIELDS) {
    const body = f === 'messages' ? { messages: '@@SLOT@@' } : { messages: msg, max_tokens: 2, [f]: '@@SLOT@@' };
    shapes.push(['/v1/chat/completions', f, body]);
  }
  shapes.push(['/v1/chat/completions', 'messages[0]', { messages: ['@@SLOT@@'] }]);
  shapes.push(['/v1/chat/completions', 'messages[0].content', { messages: [{ role: 'user', content: '@@SLOT@@' }] }]);
  shapes.push(['/v1/chat/completions', 'messages[0].role', { messages: [{ role: '@@SLOT@@', content: 'hi' }] }]);
  shapes.push(['/v1/chat/completions', 'messages[0].extra', { messages: [{ role: 'user', content: 'hi', name: '@@SLOT@@' }] }]);
  shapes.push(['/v1/chat/completions', 'content part', { messages: [{ role: 'user', content: ['@@SLOT@@'] }] }]);
  shapes.push(['/v1/chat/completions', 'content part text', { messages: [{ role: 'user', content: [{ type: 'text', text: '@@SLOT@@' }] }] }]);
  shapes.push(['/v1/chat/completions', 'chat_template_kwargs.x', { messages: msg, chat_template_kwargs: { x: '@@SLOT@@' } }]);
  for (const f of ['prompt', 'messages', 'add_special_tokens', 'model'])
    shapes.push(['/tokenize', f, f === 'prompt' ? { prompt: '@@SLOT@@' } : { prompt: 'hi', [f]: '@@SLOT@@' }]);
  shapes.push(['/tokenize', 'messages[0].content', { messages: [{ role: 'user', content: '@@SLOT@@' }] }]);
  shapes.push(['/tokenize', 'content part', { messages: [{ role: 'user', content: ['@@SLOT@@'] }] }]);
  shapes.push(['/detokenize', 'tokens', { tokens: '@@SLOT@@' }]);
  shapes.push(['/detokenize', 'tokens[0]', { tokens: ['@@SLOT@@'] }]);
  shapes.push(['/detokenize', 'model', { tokens: [1], model: '@@SLOT@@' }]);
  shapes.push(['/v1/completions', 'the whole body', '@@SLOT@@']);
  return shapes.map(([path, where, body]) => [path, where, JSON.stringify(body).replace(SLOT, deep)]);
}

test('JSON nested 10^6 deep in any field of any endpoint is a 400 saying so', async () => {
  const cases = deepBodies(DEEP);
  // Objects as deep as arrays, in a field read as a value and in one read as an object.
  cases.push(...deepBodies(DEEP_OBJECT).filter(([, where]) => ['stop', 'kv_policy_options', 'messages[0]', 'chat_template_kwargs'].includes(where)));
  for (const [path, where, body] of cases) {
    const r = await post(path, body);
    assert.equal(r.status, 400, `${path} ${where}: ${JSON.stringify(r.json).slice(0, 300)}`);
    assert.match(r.json.error.message, /JSON nested deeper than 64 levels at byte offset \d+/, `${path} ${where}`);
    assert.ok(r.json.error.message.length < 300, `${path} ${where}: the message quotes the body`);
  }
  await expectNormalCompletion();
});

test('nesting up to the limit is read as usual', async () => {
  // 60 levels inside chat_template_kwargs (the body adds one): the template ignores it.
  const kwargs = '{"x":' + '['.repeat(60) + ']'.repeat(60) + '}';
  const r = await post('/v1/chat/completions', `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"chat_template_kwargs":${kwargs}}`);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const deep = await post('/v1/chat/completions', `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"chat_template_kwargs":{"x":${'['.repeat(64)}${']'.repeat(64)}}}`);
  assert.equal(deep.status, 400);
});

// Every integer boundary, as JSON text (JavaScript numbers cannot write 2^63 - 1 exactly).
const BOUNDARIES = ['0', '1', '-1', '2147483647', '2147483648', '4294967296', '9007199254740992', '9223372036854775807',
  '18446744073709551616', '1e308', '-0.0', '1.5'];

test('numeric fields at every integer boundary: a 400 with a message or a success, never a crash', async () => {
  const fields = {
    // [endpoint, body with @ for the value, the values that must succeed]
    kv_budget_streaming: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":4,"kv_policy":"streaming","kv_budget":@}', ['0']],
    kv_budget_pagedeviction: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":4,"kv_policy":"pagedeviction","kv_budget":@}', ['0']],
    kv_budget_zipage: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":4,"kv_policy":"zipage","kv_budget":@}', ['0']],
    max_tokens: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":@}', ['1', '2147483647']],
    // Under a compressing policy the scheduler reserves for prompt + max_tokens: capped at the context.
    max_tokens_zipage: ['/v1/completions', '{"prompt":"Once upon a time","kv_policy":"zipage","kv_budget":32,"max_tokens":@}', ['1', '2147483647']],
    max_tokens_pagedeviction: ['/v1/completions', '{"prompt":"Once upon a time","kv_policy":"pagedeviction","kv_budget":32,"max_tokens":@}', ['1', '2147483647']],
    max_completion_tokens: ['/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":@}', ['1', '2147483647']],
    n: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":2,"n":@}', ['1']],
    top_k: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":2,"top_k":@}', ['0', '1', '-1', '2147483647']],
    seed: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":2,"seed":@}',
      ['0', '1', '2147483647', '2147483648', '4294967296', '9007199254740992', '9223372036854775807']],
    logprobs: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":2,"logprobs":@}', ['0', '1']],
    top_logprobs: ['/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"logprobs":true,"top_logprobs":@}', ['0', '1']],
    stop_token_ids: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":2,"stop_token_ids":[@]}', ['0', '1', '2147483647']],
    forced_output_tokens: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":2,"forced_output_tokens":[@]}', ['0', '1']],
    prompt_token_id: ['/v1/completions', '{"prompt":[@],"max_tokens":2}', ['0', '1']],
    window: ['/v1/completions', '{"prompt":"Once upon a time","max_tokens":2,"kv_policy":"zipage","kv_policy_options":{"window":@}}', ['1']],
    detokenize: ['/detokenize', '{"tokens":[@]}', ['0', '1']],
  };
  for (const [name, [path, template, successes]] of Object.entries(fields)) {
    for (const v of BOUNDARIES) {
      const r = await post(path, template.replace('@', v));
      const expected = successes.includes(v) ? 200 : 400;
      assert.equal(r.status, expected, `${name} = ${v}: ${JSON.stringify(r.json).slice(0, 300)}`);
      if (expected === 400) assert.ok(r.json.error.message.length > 0, `${name} = ${v}: a message`);
    }
  }
  // The budget limit is the CLI flag's, 2^30: its edge runs, one above it is refused by name.
  const edge = await post('/v1/completions', '{"prompt":"Once upon a time","max_tokens":4,"kv_policy":"streaming","kv_budget":1073741824}');
  assert.equal(edge.status, 200, JSON.stringify(edge.json));
  const above = await post('/v1/completions', '{"prompt":"Once upon a time","max_tokens":4,"kv_policy":"streaming","kv_budget":1073741825}');
  assert.equal(above.status, 400);
  assert.match(above.json.error.message, /kv_budget.*1073741824/);
  await expectNormalCompletion();
});

test('malformed content parts are a 400 naming the part, in chat and /tokenize', async () => {
  const parts = [
    [{ type: 5, text: 'hi' }, /messages\[0\]\.content\[0\]\.type must be the string "text", got 5/],
    [{ type: null, text: 'hi' }, /content\[0\]\.type must be the string "text", got null/],
    [{ type: [], text: 'hi' }, /content\[0\]\.type must be the string "text", got \[\]/],
    [{ text: 'hi' }, /content\[0\]\.type must be the string "text", got nothing/],
    [{ type: 'image_url', image_url: { url: 'x' } }, /content\[0\]\.type "image_url" is not supported/],
    [{ type: 'text' }, /content\[0\]\.text must be a string, got nothing/],
    [{ type: 'text', text: 5 }, /content\[0\]\.text must be a string, got 5/],
    [{ type: 'text', text: null }, /content\[0\]\.text must be a string, got null/],
    [null, /content\[0\] must be an object/],
    [[], /content\[0\] must be an object/],
    ['hi', /content\[0\] must be an object/],
    [5, /content\[0\] must be an object/],
  ];
  for (const [part, message] of parts) {
    for (const path of ['/v1/chat/completions', '/tokenize']) {
      const body = JSON.stringify({ messages: [{ role: 'user', content: [part] }], max_tokens: 2 });
      const r = await post(path, body);
      assert.equal(r.status, 400, `${path} ${JSON.stringify(part)}: ${JSON.stringify(r.json)}`);
      assert.match(r.json.error.message, message, `${path} ${JSON.stringify(part)}`);
      assert.equal(r.json.error.param, 'messages');
    }
  }
  // A second part is named by its index; a good part list still works.
  const second = await post('/tokenize', JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 7 }] }] }));
  assert.match(second.json.error.message, /messages\[0\]\.content\[1\]\.type/);
  const good = await post('/tokenize', JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }] }));
  assert.equal(good.status, 200);
  await expectNormalCompletion();
});
