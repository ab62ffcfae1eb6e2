// Connections never stall the server: many idle connections, --max-connections (a fast 503
// beyond it), the header timeout (slowloris), the keep-alive timeout, a client that half-closes
// after its request (still answered), n above --max-waiting (400), kv_head_budgets never opening
// a path a request names, and chat templates rendered off the I/O threads (/health stays fast
// while slow templates render). Raw sockets (node:net) where the openai client cannot go.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, httpGet, getMetrics, metric, MODEL } from './server_process.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Soft limit of open files of a process (the server raises its own to the hard limit).
function openFileLimit(pid) {
  const line = readFileSync(`/proc/${pid}/limits`, 'utf8').split('\n').find((l) => l.startsWith('Max open files'));
  const soft = line.trim().split(/\s+/)[3];
  return soft === 'unlimited' ? Infinity : Number(soft);
}

function connect(url) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: hostname, port: Number(port) }, () => resolve(s));
    s.once('error', reject);
  });
}

// Sends `text` on a new connection and collects everything until the server closes it.
// `halfClose`: shut down the sending side right after (as `nc -N` does).
function exchange(url, text, { halfClose = false, timeoutMs = 30000 } = {}) {
  return new Promise((resolve, reject) => {
    const { hostname, port } = new URL(url);
    const s = net.connect({ host: hostname, port: Number(port) }, () => {
      s.write(text);
      if (halfClose) s.end();
    });
    let data = '';
    const timer = setTimeout(() => { s.destroy(); reject(new Error(`no close within ${timeoutMs} ms; got: ${data.slice(0, 300)}`)); }, timeoutMs);
    s.setEncoding('utf8');
    s.on('data', (d) => { data += d; });
    s.on('error', (e) => { clearTimeout(timer); reject(e); });
    s.on('close', () => { clearTimeout(timer); resolve(data); });
  });
}

// Reads one whole HTTP response (Content-Length bodies) from a kept-alive socket.
function readResponse(s, timeoutMs = 10000) {
  return new Promise((resolve, reject) => {
    let data = '';
    const timer = setTimeout(() => { cleanup(); reject(new Error(`no response in ${timeoutMs} ms: ${data}`)); }, timeoutMs);
    const onData = (d) => {
      data += d.toString('utf8');
      const end = data.indexOf('\r\n\r\n');
      if (end < 0) return;
      const m = data.match(/content-length: *(\d+)/i);
      if (data.length >= end + 4 + (m ? Number(m[1]) : 0)) { cleanup(); resolve(data); }
    };
    const onClose = () => { cleanup(); reject(new Error(`closed before a response: ${data}`)); };
    function cleanup() { clearTimeout(timer); s.off('data', onData); s.off('close', onClose); }
    s.on('data', onData);
    s.on('close', onClose);
  });
}

// Resolves with the milliseconds until the server closes `s`.
function closedAfter(s, timeoutMs = 20000) {
  const start = Date.now();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`not closed within ${timeoutMs} ms`)), timeoutMs);
    s.once('close', () => { clearTimeout(timer); resolve(Date.now() - start); });
    s.on('error', () => {});
  });
}

async function healthLatencyMs(url) {
  const start = performance.now();
  const r = await httpGet(`${url}/health`);
  assert.equal(r.status, 200);
  return performance.now() - start;
}

function completionRequest(body) {
  const json = JSON.stringify(body);
  return `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`;
}

test('1,000 idle connections: /health answers within 100 ms and a completion runs', async () => {
  const server = await startServer(['--timeout-keep-alive', '120']);
  const sockets = [];
  try {
    // 1,000, or what the open-file limits leave (the server raised its soft limit to the hard
    // one; this process needs a descriptor per socket too).
    const n = Math.min(1000, openFileLimit(server.pid) - 200, openFileLimit(process.pid) - 100);
    assert.ok(n >= 500, `the open-file limits allow only ${n} connections`);
    for (let i = 0; i < n; i += 100)
      sockets.push(...await Promise.all(Array.from({ length: Math.min(100, n - i) }, () => connect(server.url))));
    for (;;) {  // every one accepted (the /metrics connection itself counts one)
      if (metric(await getMetrics(server.url), 'http_connections_open') >= n + 1) break;
      await sleep(50);
    }
    const latencies = [];
    for (let i = 0; i < 5; ++i) latencies.push(await healthLatencyMs(server.url));
    latencies.sort((a, b) => a - b);
    console.log(`# ${n} idle connections: /health ${latencies.map((x) => x.toFixed(1)).join(', ')} ms`);
    assert.ok(latencies[2] < 100, `/health median ${latencies[2].toFixed(1)} ms with ${n} idle connections (${latencies.map((x) => x.toFixed(1))})`);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const r = await client.completions.create({ prompt: 'Hello', max_tokens: 4, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 4);
  } finally {
    for (const s of sockets) s.destroy();
    assert.equal(await server.stop(), 0);
  }
});

test('--max-connections: beyond it a fast 503 and close; a freed slot is usable again', async () => {
  const server = await startServer(['--max-connections', '8', '--timeout-keep-alive', '60']);
  const held = [];
  try {
    for (let i = 0; i < 8; ++i) {  // each proves it was accepted by getting an answer, then stays open
      const s = await connect(server.url);
      s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
      assert.match(await readResponse(s), /^HTTP\/1\.1 200/);
      held.push(s);
    }
    const start = Date.now();
    const refused = await exchange(server.url, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n', { timeoutMs: 5000 });
    const ms = Date.now() - start;
    assert.match(refused, /^HTTP\/1\.1 503/);
    assert.match(refused, /--max-connections/);
    assert.ok(ms < 2000, `the 503 took ${ms} ms`);
    held.pop().destroy();
    for (let tries = 0; ; ++tries) {  // the server notices the close, then accepts again
      const r = await exchange(server.url, 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', { timeoutMs: 5000 });
      if (/^HTTP\/1\.1 200/.test(r)) break;
      assert.ok(tries < 50, `still refused: ${r}`);
      await sleep(50);
    }
  } finally {
    for (const s of held) s.destroy();
    assert.equal(await server.stop(), 0);
  }
});

test('slowloris: a header sent one byte a second is closed after --timeout-header', async () => {
  const server = await startServer(['--timeout-header', '2', '--timeout-keep-alive', '30']);
  try {
    const s = await connect(server.url);
    let received = '';
    s.on('data', (d) => { received += d; });
    const closed = closedAfter(s);
    const header = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(50);
    let i = 0;
    const drip = setInterval(() => { if (!s.destroyed && i < header.length) s.write(header[i++]); }, 1000);
    const ms = await closed;
    clearInterval(drip);
    assert.ok(ms >= 1500 && ms < 6000, `closed after ${ms} ms (--timeout-header 2)`);
    assert.equal(received, '', 'nothing is answered to an incomplete header');
    assert.ok((await healthLatencyMs(server.url)) < 1000);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

test('--timeout-keep-alive: an idle connection is closed after it, before or between requests', async () => {
  const server = await startServer(['--timeout-keep-alive', '1']);
  try {
    const silent = await connect(server.url);
    const silentMs = await closedAfter(silent);
    assert.ok(silentMs >= 700 && silentMs < 4000, `a connection that sent nothing closed after ${silentMs} ms`);
    const s = await connect(server.url);
    s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    assert.match(await readResponse(s), /^HTTP\/1\.1 200/);
    const ms = await closedAfter(s);
    assert.ok(ms >= 700 && ms < 4000, `an idle kept-alive connection closed after ${ms} ms`);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

test('a client that half-closes after its request still gets the whole response (plain and streamed)', async () => {
  const server = await startServer();
  try {
    const plain = await exchange(server.url, completionRequest({ prompt: 'Hello', max_tokens: 8, temperature: 0, ignore_eos: true }),
                                 { halfClose: true });
    assert.match(plain, /^HTTP\/1\.1 200/);
    const body = JSON.parse(plain.slice(plain.indexOf('\r\n\r\n') + 4));
    assert.equal(body.usage.completion_tokens, 8);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const reference = await client.completions.create({ prompt: 'Hello', max_tokens: 8, temperature: 0, ignore_eos: true });
    assert.equal(body.choices[0].text, reference.choices[0].text);

    const streamed = await exchange(server.url, completionRequest({ prompt: 'Hello', max_tokens: 8, temperature: 0, ignore_eos: true, stream: true }),
                                    { halfClose: true });
    assert.match(streamed, /^HTTP\/1\.1 200/);
    assert.match(streamed, /data: \[DONE\]/);
    const text = [...streamed.matchAll(/data: (\{.*\})/g)].map((m) => JSON.parse(m[1]).choices[0]?.text ?? '').join('');
    assert.equal(text, reference.choices[0].text);
    // A request cut short by end of stream is a disconnect: nothing is answered.
    const cut = await exchange(server.url, completionRequest({ prompt: 'Hello', max_tokens: 8 }).slice(0, -5), { halfClose: true });
    assert.equal(cut, '');
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

test('n above --max-waiting: a 400 naming n (it could never be admitted), not a 503 forever', async () => {
  const server = await startServer(['--max-waiting', '2']);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0 });
    await assert.rejects(client.completions.create({ prompt: 'Hello', max_tokens: 2, n: 3 }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.param, 'n');
      assert.match(e.message, /3 choices.*--max-waiting/);
      return true;
    });
    await assert.rejects(client.completions.create({ prompt: ['a', 'b', 'c'], max_tokens: 2 }), OpenAI.BadRequestError);
    const r = await client.completions.create({ prompt: 'Hello', max_tokens: 2, n: 2 });
    assert.equal(r.choices.length, 2);
  } finally {
    assert.equal(await server.stop(), 0);
  }
});

// Ratios for the tiny model (6 layers x 4 KV heads) in `origami calibrate`'s format.
function tinyBudgets() {
  const c = JSON.parse(readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
  const row = [1.0, 0.5, 0.8, 0.4];
  const layers = Array.from({ length: c.num_hidden_layers }, () => row.slice(0, c.num_key_value_heads));
  return {
    format: 'origami-head-budgets', version: 1,
    model: { model_type: c.model_type, num_layers: c.num_hidden_layers, num_kv_heads: c.num_key_value_heads,
             num_attention_heads: c.num_attention_heads, head_dim: c.head_dim, hidden_size: c.hidden_size, vocab_size: c.vocab_size },
    calibration: { scorer: 'snapkv', alpha: 2, rho: 0.25, samples: 1, sample_tokens: [256] },
    ratios: layers, mean: layers, std: layers.map((r) => r.map(() => 0)),
  };
}

test('kv_head_budgets: never a path (a FIFO is not opened), inline objects and operator-loaded names work', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'origami-budgets-'));
  const file = path.join(dir, 'tiny.json');
  writeFileSync(file, JSON.stringify(tinyBudgets()));
  const fifo = path.join(dir, 'fifo');
  execFileSync('mkfifo', [fifo]);
  const server = await startServer(['--heads-per-group', '2', '--kv-head-budgets-file', `tiny=${file}`]);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 10000 });
    const ask = (budgets) => client.completions.create({ prompt: 'Hello', max_tokens: 4, temperature: 0, kv_policy: 'tangram',
                                                         kv_budget: 128, kv_head_budgets: budgets });
    for (const p of [fifo, file, '/dev/zero']) {
      await assert.rejects(ask(p), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, String(e));
        assert.match(e.message, /never opens a path/);
        return true;
      });
    }
    assert.equal((await ask(tinyBudgets())).usage.completion_tokens, 4);
    assert.equal((await ask('tiny')).usage.completion_tokens, 4);
    const wrong = tinyBudgets();
    wrong.format = 'sk-live-not-a-budget-file';
    await assert.rejects(ask(wrong), (e) => {
      assert.equal(e.status, 400);
      assert.ok(!e.message.includes('sk-live'), e.message);
      return true;
    });
    assert.equal((await httpGet(`${server.url}/health`)).status, 200);
  } finally {
    assert.equal(await server.stop(), 0);
    rmSync(dir, { recursive: true, force: true });
  }
});

// A copy of the model folder whose chat template runs until the Jinja engine's render bounds stop
// it (docs/reliability.md, "Chat templates: bounded renders": steps, memory, a 1 s deadline), so
// every render holds a prompt worker for the longest its step bound allows (20-30 ms on the dev
// machine: 5M steps at ~5 ns) and ends in a 400 naming the limit.
function slowTemplateModel() {
  const dir = mkdtempSync(path.join(tmpdir(), 'origami-slow-template-'));
  for (const f of readdirSync(MODEL)) if (f !== 'tokenizer_config.json') symlinkSync(path.join(MODEL, f), path.join(dir, f));
  const config = JSON.parse(readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
  config.chat_template = '{%- for a in range(10) %}{%- for i in range(100000) %}{%- endfor %}{%- endfor %}' + config.chat_template;
  writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  return dir;
}

test('slow chat templates render off the I/O threads: /health stays fast; beyond the queue a fast 503', async () => {
  const model = slowTemplateModel();
  const server = await startServer(['--prompt-workers', '1', '--max-queued-prompts', '2'], { model });
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 120000 });
    // A burst of 12 slow chats at once overfills the one worker and its queue of 2 whatever a
    // render costs on this machine (the 12 arrive within a few ms; draining 3 takes 3 renders),
    // then a slow chat every 25 ms for 2 s keeps the worker busy: each gets a 400 once its render
    // hits the bounds, or a 503 at once when the queue is full.
    const sent = [];
    const latencies = [];
    const until = Date.now() + 2000;
    const send = () => {
      const t0 = Date.now();
      sent.push(client.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 })
        .then(() => ({ status: 200, ms: Date.now() - t0 }), (e) => ({ status: e.status, ms: Date.now() - t0 })));
    };
    for (let i = 0; i < 12; ++i) send();
    const sender = (async () => {
      while (Date.now() < until) {
        send();
        await sleep(25);
      }
    })();
    while (Date.now() < until) {
      latencies.push(await healthLatencyMs(server.url));
      await sleep(50);
    }
    await sender;
    const results = await Promise.all(sent);
    const count = (st) => results.filter((r) => r.status === st).length;
    latencies.sort((a, b) => a - b);
    console.log(`# ${results.length} slow chats: ${count(400)} refused by the render bounds, ${count(503)} beyond the queue; ` +
                `/health ${latencies.length} times while they ran: median ${latencies[Math.floor(latencies.length / 2)].toFixed(1)} ms, ` +
                `max ${latencies.at(-1).toFixed(1)} ms`);
    for (const r of results) assert.ok(r.status === 400 || r.status === 503, `unexpected status ${r.status}`);
    assert.ok(count(400) >= 3, 'renders ran on the worker');
    assert.ok(count(503) >= 1, 'the queue filled');
    for (const r of results.filter((x) => x.status === 503)) assert.ok(r.ms < 1000, `a 503 took ${r.ms} ms`);
    assert.ok(latencies.length >= 10);
    assert.ok(latencies[Math.floor(latencies.length / 2)] < 100 && latencies.at(-1) < 500,
              `/health latencies while templates render: ${latencies.map((x) => x.toFixed(1))} ms`);
    const m = await getMetrics(server.url);
    assert.ok(metric(m, 'num_requests_rejected_total') >= 1);
  } finally {
    assert.equal(await server.stop(), 0);
    rmSync(model, { recursive: true, force: true });
  }
});
