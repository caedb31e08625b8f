// The TypeScript/JavaScript client against a real control plane and worker.
//
// clients/clients_test.go (go test ./clients) starts `taskrun serve` and
// `taskrun worker` on loopback and runs `node --test test/` with
// TASKRUN_URL, TASKRUN_TOKEN and TASKRUN_OTHER_TOKEN (two users),
// TASKRUN_WORKER_TOKEN, TASKRUN_TEST_IMAGE and TASKRUN_CLIENT_RUN_LOG (a file
// each submitted run's ID is appended to). Without TASKRUN_URL it skips.

import assert from 'node:assert/strict';
import { appendFileSync } from 'node:fs';
import net from 'node:net';
import { describe, it, before } from 'node:test';
import { gzipSync } from 'node:zlib';

import {
  AuthenticationError,
  BadRequestError,
  Client,
  ConflictError,
  NotFoundError,
  PermissionDeniedError,
  WaitTimeoutError,
  errorForStatus,
  RateLimitError,
  ServerError,
} from '../src/index.js';

const URL_ = process.env.TASKRUN_URL ?? '';
const skip = URL_ ? false : 'TASKRUN_URL is not set: run through go test ./clients, which starts serve and a worker';

// What the run prints, in three pieces a second apart: a line, bytes that
// are not UTF-8, and a tail without a newline.
const EXPECTED = Buffer.from('first line\nbin:\xff\x01 end\nno newline', 'latin1');
const SCRIPT = "printf 'first line\\n'; sleep 1; printf 'bin:\\377\\001 end\\n'; sleep 1; printf 'no newline'";

/** @param {Uint8Array[]} parts */
const join = (parts) => Buffer.concat(parts.map((p) => Buffer.from(p)));

/** A gzip'd tar holding one regular file. @param {string} name @param {Buffer} data */
function tarGz(name, data) {
  const h = Buffer.alloc(512);
  const put = (s, at, len) => h.write(s.padEnd(len, '\0').slice(0, len), at, 'latin1');
  const oct = (n, len) => n.toString(8).padStart(len - 1, '0') + '\0';
  put(name, 0, 100);
  put(oct(0o644, 8), 100, 8);
  put(oct(0, 8), 108, 8);
  put(oct(0, 8), 116, 8);
  put(oct(data.length, 12), 124, 12);
  put(oct(Math.floor(Date.now() / 1000), 12), 136, 12);
  put('        ', 148, 8);
  put('0', 156, 1);
  put('ustar\x0000', 257, 8);
  let sum = 0;
  for (const b of h) sum += b;
  put(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8);
  const pad = Buffer.alloc((512 - (data.length % 512)) % 512);
  return gzipSync(Buffer.concat([h, data, pad, Buffer.alloc(1024)]));
}

/**
 * A TCP proxy on loopback to the control plane that cuts every connection
 * `lifeMs` after it was opened.
 * @param {string} upstream @param {number} lifeMs
 */
async function cuttingProxy(upstream, lifeMs) {
  const u = new URL(upstream);
  const state = { connections: 0, url: '', close: () => {} };
  const server = net.createServer((client) => {
    state.connections++;
    const up = net.connect(Number(u.port), u.hostname);
    client.pipe(up).on('error', () => {});
    up.pipe(client).on('error', () => {});
    client.on('error', () => {});
    up.on('error', () => {});
    setTimeout(() => {
      client.destroy();
      up.destroy();
    }, lifeMs).unref();
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const addr = /** @type {import('node:net').AddressInfo} */ (server.address());
  state.url = `http://127.0.0.1:${addr.port}`;
  state.close = () => server.close();
  return state;
}

describe('errors', () => {
  it('are typed by status', () => {
    assert.ok(errorForStatus(401, 'x') instanceof AuthenticationError);
    assert.ok(errorForStatus(404, 'x') instanceof NotFoundError);
    assert.ok(errorForStatus(429, 'x', { retryAfter: 5 }) instanceof RateLimitError);
    assert.ok(errorForStatus(503, 'x') instanceof ServerError);
    assert.equal(errorForStatus(409, 'already ended').serverMessage, 'already ended');
  });
});

describe('against serve and a worker', { skip }, () => {
  /** @type {Client} */ let client;
  /** @type {Client} */ let other;
  const image = process.env.TASKRUN_TEST_IMAGE ?? '';

  before(() => {
    client = new Client(URL_, process.env.TASKRUN_TOKEN ?? '');
    other = new Client(URL_, process.env.TASKRUN_OTHER_TOKEN ?? '');
  });

  /** @param {string} script @param {{workspace?: Uint8Array}} [opts] */
  async function submit(script, opts) {
    const sub = await client.submit(
      { prompt: 'js client test', image, runtime: 'runc', command: ['sh', '-c', script] },
      opts,
    );
    assert.equal(sub.status, 'QUEUED');
    if (process.env.TASKRUN_CLIENT_RUN_LOG) appendFileSync(process.env.TASKRUN_CLIENT_RUN_LOG, sub.run_id + '\n');
    return sub.run_id;
  }

  it('follows the exact output, and the run succeeds', async () => {
    const id = await submit(SCRIPT);
    const chunks = [];
    for await (const c of client.follow(id)) chunks.push(c);
    assert.deepEqual(join(chunks.map((c) => c.data)), EXPECTED);
    assert.equal(chunks[0].offset, 0);
    for (let i = 1; i < chunks.length; i++) {
      assert.equal(chunks[i].offset, chunks[i - 1].offset + chunks[i - 1].data.length, 'pieces are contiguous');
    }

    const run = await client.wait(id, { timeoutMs: 120000 });
    assert.equal(run.status, 'SUCCEEDED', run.error);
    assert.equal(run.exit_code, 0);
    assert.equal(run.stream_next, EXPECTED.length);
    assert.equal(run.stream_ended, true);
    assert.equal(run.task.prompt, 'js client test');

    // Resuming at an offset gives exactly the rest.
    assert.deepEqual(Buffer.from(await client.readOutput(id, 11)), EXPECTED.subarray(11));
    const rest = [];
    for await (const c of client.follow(id, 16)) rest.push(c.data);
    assert.deepEqual(join(rest), EXPECTED.subarray(16));

    const listed = await client.listRuns({ status: 'SUCCEEDED', limit: 500 });
    assert.ok(listed.some((r) => r.id === id));
    assert.ok(listed.every((r) => r.status === 'SUCCEEDED'));
  });

  it('resumes a follow after the connection drops', async () => {
    const id = await submit('for i in 1 2 3 4; do echo line $i; sleep 1; done');
    const proxy = await cuttingProxy(URL_, 1500);
    try {
      const cut = new Client(proxy.url, process.env.TASKRUN_TOKEN ?? '');
      const parts = [];
      for await (const c of cut.follow(id, 0, { maxReconnects: 10 })) parts.push(c.data);
      assert.equal(join(parts).toString(), 'line 1\nline 2\nline 3\nline 4\n');
      assert.ok(proxy.connections > 1, 'the follow was cut and resumed');
    } finally {
      proxy.close();
    }
    assert.equal((await client.wait(id, { timeoutMs: 120000 })).status, 'SUCCEEDED');
  });

  it('uploads a workspace', async () => {
    const ws = tarGz('greeting.txt', Buffer.from('hello from the workspace\n'));
    const id = await submit('cat "$HOME/greeting.txt"', { workspace: ws });
    const run = await client.wait(id, { timeoutMs: 120000 });
    assert.equal(run.status, 'SUCCEEDED', run.error);
    assert.equal(Buffer.from(await client.readOutput(id)).toString(), 'hello from the workspace\n');
    assert.equal(run.spec.workspace?.size, ws.length);
  });

  it("reads the run's record and patch", async () => {
    const id = await submit('echo new > "$HOME/notes.txt"', { workspace: tarGz('notes.txt', Buffer.from('old\n')) });
    assert.equal((await client.wait(id, { timeoutMs: 120000 })).status, 'SUCCEEDED');
    let record;
    for (const deadline = Date.now() + 30000; ; ) {
      try {
        record = await client.record(id); // the worker stores it as the run ends
        break;
      } catch (e) {
        if (!(e instanceof NotFoundError) || Date.now() > deadline) throw e;
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    assert.equal(record.run_id, id);
    assert.ok(Buffer.from(await client.patch(id)).toString().includes('-old\n+new\n'));
    assert.equal(/** @type {any} */ (await client.changes(id)).summary.modified, 1);
    assert.equal(Buffer.from(await client.file(id, 'home/notes.txt')).toString(), 'new\n');
    await assert.rejects(client.file(id, '../other/changes.json'), TypeError);
    await assert.rejects(other.patch(id), NotFoundError);
  });

  it("answers another tenant's calls on a run with NotFoundError", async () => {
    const id = await submit('echo mine');
    for (const call of [
      () => other.get(id),
      () => other.cancel(id),
      () => other.readOutput(id),
      async () => {
        for await (const _ of other.follow(id));
      },
    ]) {
      await assert.rejects(call, (e) => {
        assert.ok(e instanceof NotFoundError, String(e));
        assert.equal(e.status, 404);
        assert.ok(e.serverMessage);
        return true;
      });
    }
    assert.ok(!(await other.listRuns({ limit: 500 })).some((r) => r.id === id));
    const run = await client.wait(id, { timeoutMs: 120000 });
    assert.equal(run.status, 'SUCCEEDED', run.error);
    await assert.rejects(client.get('r-no-such-run'), NotFoundError);
  });

  it('cancels a long run', async () => {
    const id = await submit('echo started; sleep 300');
    await assert.rejects(client.wait(id, { timeoutMs: 500, pollIntervalMs: 100 }), (e) => {
      assert.ok(e instanceof WaitTimeoutError, String(e));
      assert.ok(['QUEUED', 'RUNNING'].includes(e.run?.status ?? ''));
      return true;
    });
    // Wait until it runs (its first line is out), then cancel.
    const it = client.follow(id);
    const first = await it.next();
    await it.return(undefined);
    assert.ok(Buffer.from('started\n').subarray(0, first.value?.data.length).equals(Buffer.from(first.value?.data ?? [])));
    let run = await client.cancel(id);
    assert.equal(run.id, id);
    assert.ok(run.cancel_requested || run.status === 'CANCELLED');
    run = await client.wait(id, { timeoutMs: 120000, pollIntervalMs: 200 });
    assert.equal(run.status, 'CANCELLED');
    await assert.rejects(client.cancel(id), (e) => e instanceof ConflictError && e.status === 409);
  });

  it('cancels queued and running runs', async () => {
    const ids = [];
    for (let i = 0; i < 4; i++) ids.push(await submit('sleep 300'));
    for (const id of [...ids].reverse()) await client.cancel(id);
    for (const id of ids) {
      assert.equal((await client.wait(id, { timeoutMs: 120000, pollIntervalMs: 200 })).status, 'CANCELLED');
    }
  });

  it('gives a bad token an AuthenticationError', async () => {
    const bad = new Client(URL_, 'not-a-token-of-this-server');
    await assert.rejects(bad.listRuns(), (e) => {
      assert.ok(e instanceof AuthenticationError, String(e));
      assert.equal(e.status, 401);
      assert.equal(e.serverMessage, 'missing or unknown bearer token');
      return true;
    });
    await assert.rejects(bad.submit({ prompt: 'hi' }), AuthenticationError);
    const worker = new Client(URL_, process.env.TASKRUN_WORKER_TOKEN ?? '');
    await assert.rejects(worker.listRuns(), (e) => {
      assert.ok(e instanceof PermissionDeniedError, String(e));
      assert.equal(e.status, 403);
      assert.match(e.serverMessage, /worker token is refused/);
      return true;
    });
  });

  it('lists the workers', async () => {
    const workers = await client.workers();
    assert.equal(workers.length, 1, JSON.stringify(workers));
    assert.equal(workers[0].capacity.slots, 2);
    assert.ok(/** @type {string[]} */ (workers[0].labels.images).includes(image));
  });

  it('names the bad field', async () => {
    await assert.rejects(client.submit({ prompt: 'hi', image, env: ['NO_EQUALS_SIGN'] }), (e) => {
      assert.ok(e instanceof BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.match(e.serverMessage, /NAME=VALUE/);
      return true;
    });
    await assert.rejects(client.submit({ prompt: '   ' }), BadRequestError);
    await assert.rejects(client.get('../etc'), TypeError);
  });
});
