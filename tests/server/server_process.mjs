// Starts `origami serve` on a free port of 127.0.0.1 with the tiny model and stops it with
// SIGTERM (the server must exit 0). ORIGAMI_BIN and ORIGAMI_MODEL come from ctest.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const BIN = process.env.ORIGAMI_BIN ?? path.resolve(here, '../../build-dev/origami');
export const MODEL = process.env.ORIGAMI_MODEL ?? path.resolve(here, '../../../shared/models/origami-tiny-qwen3');

// startTimeoutMs: how long the server may take to listen (CUDA servers load, initialise NCCL and
// capture their graphs first).
// ORIGAMI_SERVE_ARGS: flags every server of the run gets (space-separated), e.g. --async-scheduling
// to run a whole suite under asynchronous scheduling (ctest's server_*_async_scheduling).
const SERVE_ARGS = (process.env.ORIGAMI_SERVE_ARGS ?? '').split(' ').filter((a) => a.length > 0);

export async function startServer(extraArgs = [], { model = MODEL, startTimeoutMs = 60000 } = {}) {
  const args = ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1', ...SERVE_ARGS, ...extraArgs];
  const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in ${startTimeoutMs / 1000} s: ${stderr}`)),
                             startTimeoutMs);
    proc.stdout.on('data', (d) => {
      stdout += d;
      const m = stdout.match(/at (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}): ${stderr}`)); });
  });
  return {
    url,
    proc,
    pid: proc.pid,
    stderr: () => stderr,
    // SIGTERM; resolves with the exit code.
    stop: () => new Promise((resolve) => {
      if (proc.exitCode !== null) return resolve(proc.exitCode);
      proc.removeAllListeners('exit');
      proc.on('exit', (code) => resolve(code));
      proc.kill('SIGTERM');
    }),
  };
}

// `origami generate` on the same model: the reference of greedy outputs.
export function generate(prompt, maxTokens, { chat = false } = {}) {
  const args = ['generate', '--model', MODEL, '--threads', '1', '--prompt', prompt, '--temperature', '0', '--max-tokens', String(maxTokens)];
  if (chat) args.push('--chat');
  const out = execFileSync(BIN, args, { encoding: 'utf8' });
  return out.endsWith('\n') ? out.slice(0, -1) : out;  // generate ends the text with a newline
}

// `origami generate --input` of one JSONL request with --logprobs N: its result object (the
// engine's token ids and log-probabilities, the reference for the server's logprobs fields).
export function generateWithLogprobs(request, logprobs) {
  const dir = mkdtempSync(path.join(tmpdir(), 'origami-logprobs-'));
  try {
    const input = path.join(dir, 'in.jsonl');
    writeFileSync(input, JSON.stringify(request) + '\n');
    const out = execFileSync(BIN, ['generate', '--model', MODEL, '--threads', '1', '--input', input, '--logprobs', String(logprobs)],
                             { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
    return JSON.parse(out.trim().split('\n')[0]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// Parses origami:NAME{...} values of a Prometheus text page.
export function metric(text, name, labelFilter = '') {
  let total = 0;
  let found = false;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`origami:${name}{`)) continue;
    if (labelFilter && !line.includes(labelFilter)) continue;
    total += Number(line.slice(line.lastIndexOf(' ') + 1));
    found = true;
  }
  if (!found) throw new Error(`metric origami:${name} ${labelFilter} not found`);
  return total;
}

// GET over a connection of its own that the server closes after answering (no keep-alive
// connection left open to count as a server file descriptor).
export function httpGet(url) {
  return new Promise((resolve, reject) => {
    http.get(url, { agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
    }).on('error', reject);
  });
}

export async function getMetrics(url) {
  return (await httpGet(`${url}/metrics`)).body;
}

// Waits until the server's KV blocks in use and running/waiting requests are back to zero.
export async function waitIdle(url, timeoutMs = 20000) {
  const start = Date.now();
  for (;;) {
    const m = await getMetrics(url);
    if (metric(m, 'kv_blocks_used') === 0 && metric(m, 'num_requests_running') === 0 && metric(m, 'num_requests_waiting') === 0)
      return m;
    if (Date.now() - start > timeoutMs) throw new Error(`server not idle after ${timeoutMs} ms:\n${m}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export function countFds(pid) { return readdirSync(`/proc/${pid}/fd`).length; }

// What each open descriptor of the process points at ("socket:[123]", "anon_inode:[eventfd]",
// a path), sorted: printed when a count differs, so a failure names the descriptor.
export function listFds(pid) {
  const out = [];
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try { out.push(`${fd} -> ${readlinkSync(`/proc/${pid}/fd/${fd}`)}`); } catch { /* closed meanwhile */ }
  }
  return out.sort();
}

// The descriptor count once it has stopped moving: a connection the client has finished with
// may still be open on the server's side for a moment (the server closes it after its write
// completes), so a single reading can count one that is already on its way out. Returns the
// count unchanged for quietMs, or the last reading after timeoutMs.
export async function settledFds(pid, { quietMs = 500, timeoutMs = 10000 } = {}) {
  const start = Date.now();
  let count = countFds(pid);
  let since = Date.now();
  while (Date.now() - since < quietMs && Date.now() - start < timeoutMs) {
    await new Promise((r) => setTimeout(r, 50));
    const now = countFds(pid);
    if (now !== count) { count = now; since = Date.now(); }
  }
  return count;
}
export function countThreads(pid) { return readdirSync(`/proc/${pid}/task`).length; }
