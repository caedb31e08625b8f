// The live-run client against a real taskrun daemon: clients/clients_test.go
// starts `taskrun daemon` and names its socket in TASKRUN_HOST (with
// TASKRUN_TEST_IMAGE and TASKRUN_CLIENT_RUN_LOG). Without it, it skips.

import assert from 'node:assert/strict';
import { appendFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { describe, it, before, after } from 'node:test';

import { BadRequestError, LiveClient, NotFoundError } from '../src/index.js';

const HOST = process.env.TASKRUN_HOST ?? '';
const IMAGE = process.env.TASKRUN_TEST_IMAGE ?? 'taskrun/testbox:local';
const skip = HOST ? false : 'TASKRUN_HOST is not set: run through go test ./clients, which starts a daemon';

describe('LiveClient', { skip }, () => {
  const c = new LiveClient(HOST);
  const runId = 'ts' + randomBytes(5).toString('hex');

  before(async () => {
    if (process.env.TASKRUN_CLIENT_RUN_LOG) appendFileSync(process.env.TASKRUN_CLIENT_RUN_LOG, runId + '\n');
    await c.start(runId, { image: IMAGE, user: 'alice', ports: [8080] });
  });
  after(async () => {
    await c.stop(runId);
  });

  it('lists its declared ports with their tokens', async () => {
    const ports = await c.ports(runId);
    assert.equal(ports.length, 1);
    assert.equal(ports[0].port, 8080);
    assert.equal(ports[0].path, `/v1/runs/${runId}/ports/8080/`);
    assert.equal(ports[0].token.length, 43);
  });

  it('runs commands to their end', async () => {
    for (let i = 0; i < 5; i++) {
      const r = await c.exec(runId, ['sh', '-c', 'echo "$N"; echo e >&2; exit $N'], { env: [`N=${i}`] });
      assert.equal(r.exit, i);
      assert.equal(Buffer.from(r.stdout).toString(), `${i}\n`);
      assert.equal(Buffer.from(r.stderr).toString(), 'e\n');
    }
  });

  it('writes stdin', async () => {
    const p = await c.startProcess(runId, ['sh', '-c', 'while read l; do echo "got $l"; done'], { stdin: true });
    await c.writeStdin(runId, p.id, 'a\n');
    await c.writeStdin(runId, p.id, 'b\n', { close: true });
    let out = '';
    for await (const ch of c.output(runId, p.id)) out += Buffer.from(ch.data).toString();
    assert.equal(out, 'got a\ngot b\n');
    assert.equal((await c.process(runId, p.id)).result?.exit, 0);
  });

  it('signals and reattaches from an offset', async () => {
    const p = await c.startProcess(runId, ['sh', '-c', "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"]);
    let seen = '';
    let offset = 0;
    for (let i = 0; i < 600 && !seen.includes('ready'); i++) {
      for await (const ch of c.output(runId, p.id, offset, { follow: false })) {
        seen += Buffer.from(ch.data).toString();
        offset = ch.offset + ch.data.length;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(seen, 'ready\n');
    await assert.rejects(c.signal(runId, p.id, 'SEGV'), BadRequestError);
    await c.signal(runId, p.id, 'TERM');
    let rest = '';
    for await (const ch of c.output(runId, p.id, offset)) rest += Buffer.from(ch.data).toString();
    assert.equal(rest, 'term\n');
    assert.equal((await c.process(runId, p.id)).result?.exit, 7);
    assert.ok((await c.processes(runId)).some((x) => x.id === p.id));
  });

  it('says an unknown process is not found', async () => {
    await assert.rejects(c.process(runId, 'p999'), (e) => e instanceof NotFoundError && e.message.includes('p999'));
    await assert.rejects(c.signal('no-such-run', 'p1', 'TERM'), NotFoundError);
  });
});
