// The live-run client against a real control plane and worker:
// clients/clients_test.go starts `taskrun serve` and `taskrun worker
// --live-listen` and names them in TASKRUN_URL, TASKRUN_TOKEN,
// TASKRUN_OTHER_TOKEN (with TASKRUN_TEST_IMAGE, TASKRUN_CLIENT_RUN_LOG and
// TASKRUN_WORKER_METRICS). Without TASKRUN_URL, it skips.

import assert from 'node:assert/strict';
import { appendFileSync, existsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { describe, it, before, after } from 'node:test';

import { BadRequestError, LiveClient, NotFoundError } from '../src/index.js';

const URL_ = process.env.TASKRUN_URL ?? '';
const TOKEN = process.env.TASKRUN_TOKEN ?? '';
const OTHER = process.env.TASKRUN_OTHER_TOKEN ?? '';
const IMAGE = process.env.TASKRUN_TEST_IMAGE ?? 'taskrun/testbox:local';
const METRICS = process.env.TASKRUN_WORKER_METRICS ?? '';
const skip = URL_ ? false : 'TASKRUN_URL is not set: run through go test ./clients, which starts a control plane';

const PORT_AGENT = 'mkdir -p /tmp/www && echo hello-port > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function logRun(id) {
  if (process.env.TASKRUN_CLIENT_RUN_LOG) appendFileSync(process.env.TASKRUN_CLIENT_RUN_LOG, id + '\n');
}

async function waitStatus(c, id, seconds) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const st = await c.status(id);
    if (st !== 'RUNNING' || Date.now() > deadline) return st;
    await sleep(200);
  }
}

describe('LiveClient on the control plane', { skip }, () => {
  const c = new LiveClient({ url: URL_, token: TOKEN });
  const bob = new LiveClient({ url: URL_, token: OTHER });
  let r = '';

  before(async () => {
    r = await c.start(undefined, { image: IMAGE, command: ['sh', '-c', PORT_AGENT], ports: [8080] });
    logRun(r);
  });
  after(async () => {
    await c.stop(r);
    assert.equal(await waitStatus(c, r, 120), 'CANCELLED');
  });

  it('serves 50 commands and 200 file operations', async () => {
    for (let i = 0; i < 50; i++) {
      const x = await c.exec(r, ['sh', '-c', 'echo "$N"; echo e >&2; exit $((N % 3))'], { env: [`N=${i}`] });
      assert.deepEqual([x.exit, Buffer.from(x.stdout).toString(), Buffer.from(x.stderr).toString()], [i % 3, `${i}\n`, 'e\n']);
    }
    let ops = 0;
    for (let i = 0; i < 40; i++) {
      const name = `t${i}.txt`;
      const data = `content ${i}\n`.repeat(i + 1);
      await c.writeFile(r, name, data);
      assert.equal(Buffer.from(await c.readFile(r, name)).toString(), data);
      assert.equal((await c.stat(r, name)).size, data.length);
      assert.ok((await c.listFiles(r, '.')).some((e) => e.name === name));
      await c.remove(r, name);
      ops += 5;
    }
    assert.equal(ops, 200);
    await assert.rejects(c.stat(r, 't0.txt'), NotFoundError);
  });

  it('watches a path', async () => {
    const x = await c.exec(r, ['mkdir', '-p', 'tswatched']);
    assert.equal(x.exit, 0, Buffer.from(x.stderr).toString());
    const events = c.watch(r, 'tswatched');
    assert.equal((await events.next()).value.event, 'watching');
    await c.writeFile(r, 'tswatched/w.txt', 'x');
    await c.remove(r, 'tswatched/w.txt');
    const seen = [];
    for await (const e of events) {
      seen.push(`${e.event} ${e.path}`);
      if (seen.at(-1) === 'removed tswatched/w.txt') break;
    }
    assert.ok(seen.includes('created tswatched/w.txt'), seen.join(', '));
    assert.ok(seen.includes('modified tswatched/w.txt'), seen.join(', '));
  });

  it('refuses a traversal or a symlink out of the home', async () => {
    const outside = `/tmp/taskrun-escape-${randomBytes(8).toString('hex')}`;
    await assert.rejects(c.readFile(r, '../../../../etc/passwd'), BadRequestError);
    const x = await c.exec(r, ['sh', '-c', `ln -s /etc/passwd tslink && ln -s ${outside} tswlink && ln -s / tsroot`]);
    assert.equal(x.exit, 0, Buffer.from(x.stderr).toString());
    await assert.rejects(c.readFile(r, 'tslink'), BadRequestError);
    await assert.rejects(c.readFile(r, 'tsroot/etc/passwd'), BadRequestError);
    await assert.rejects(c.writeFile(r, 'tswlink', 'escaped'), BadRequestError);
    assert.equal(existsSync(outside), false, 'a write through a symlink reached the host');
  });

  it('answers a declared port only with its token, to its tenant only', async () => {
    const ports = await c.ports(r);
    assert.equal(ports.length, 1);
    const tok = ports[0].token;
    let res;
    const deadline = Date.now() + 60000;
    do {
      res = await c.portRequest(r, 8080, '/', { token: tok });
      if (res.status !== 200) await sleep(200);
    } while (res.status !== 200 && Date.now() < deadline);
    assert.deepEqual([res.status, Buffer.from(res.body).toString()], [200, 'hello-port\n']);
    assert.equal((await c.portRequest(r, 8080, '/', { token: '' })).status, 401);
    assert.equal((await c.portRequest(r, 8080, '/', { token: 'x' + tok.slice(1) })).status, 401);
    assert.equal((await bob.portRequest(r, 8080, '/', { token: tok })).status, 404);
  });

  it('gives another tenant 404 for every call on the run', async () => {
    const calls = [
      () => bob.exec(r, ['true']), () => bob.startProcess(r, ['true']), () => bob.processes(r),
      () => bob.process(r, 'p1'), async () => { for await (const _ of bob.output(r, 'p1')); },
      () => bob.writeStdin(r, 'p1', 'x'), () => bob.signal(r, 'p1', 'TERM'), () => bob.ports(r),
      () => bob.usage(r), () => bob.readFile(r, 'x'), () => bob.writeFile(r, 'x', 'y'), () => bob.listFiles(r),
      () => bob.stat(r, '.'), () => bob.remove(r, 'x'), () => bob.status(r), () => bob.stop(r),
    ];
    for (const call of calls) await assert.rejects(call(), NotFoundError);
    assert.equal(await c.status(r), 'RUNNING');
  });

  it('reports its usage, and the worker exports it', async () => {
    let u;
    const deadline = Date.now() + 30000;
    for (;;) {
      try {
        u = await c.usage(r);
        break;
      } catch (e) {
        if (Date.now() > deadline) throw e;
        await sleep(200);
      }
    }
    assert.ok(u.samples > 0 && u.peak_memory_bytes > 0);
    if (METRICS) {
      const text = await (await fetch(`http://${METRICS}/metrics`)).text();
      assert.ok(text.includes(`taskrun_worker_live_run_cpu_seconds{run="${r}"}`));
    }
  });
});

describe('An idle live run on the control plane', { skip }, () => {
  it('is stopped at its idle timeout', async () => {
    const c = new LiveClient({ url: URL_, token: TOKEN });
    const r = await c.start(undefined, { image: IMAGE, idleTimeout: 3 });
    logRun(r);
    const x = await c.exec(r, ['echo', 'alive']);
    assert.equal(Buffer.from(x.stdout).toString(), 'alive\n');
    assert.equal(await waitStatus(c, r, 120), 'CANCELLED');
  });
});
