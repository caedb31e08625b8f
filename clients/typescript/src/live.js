// Client of a host's taskrun daemon: live runs and their processes, over
// its unix socket (node:http, no dependencies). See docs/live-runs.md.

import http from 'node:http';

import { TransportError, errorForStatus } from './index.js';

/** The daemon's socket: $TASKRUN_HOST, else root's. */
export function socketPath() {
  return process.env.TASKRUN_HOST || '/run/taskrun/taskrun.sock';
}

const q = encodeURIComponent;

export class LiveClient {
  /** @param {string} [path] the daemon's socket (socketPath() by default) */
  constructor(path) {
    this.path = path || socketPath();
  }

  /**
   * One request: the response, its status checked (a refusal throws the
   * APIError subclass of its status).
   * @param {string} method @param {string} url @param {Buffer|string} [body]
   * @returns {Promise<http.IncomingMessage>}
   */
  request(method, url, body) {
    return new Promise((resolve, reject) => {
      const req = http.request({ socketPath: this.path, method, path: url, headers: { 'Content-Type': 'application/json' } }, (resp) => {
        if (resp.statusCode !== undefined && resp.statusCode >= 200 && resp.statusCode < 300) {
          resolve(resp);
          return;
        }
        const parts = [];
        resp.on('data', (d) => parts.push(d));
        resp.on('end', () => {
          const text = Buffer.concat(parts).toString();
          let msg = text.trim() || String(resp.statusMessage);
          try {
            msg = JSON.parse(text).error ?? msg;
          } catch {
            // not JSON: the text
          }
          reject(errorForStatus(resp.statusCode ?? 0, msg, { method, url }));
        });
        resp.on('error', (e) => reject(new TransportError(`taskrun daemon at ${this.path}: ${e.message}`)));
      });
      req.on('error', (e) => reject(new TransportError(`taskrun daemon at ${this.path}: ${e.message}`)));
      req.end(body);
    });
  }

  /** @param {string} method @param {string} url @param {unknown} [body] */
  async json(method, url, body) {
    const resp = await this.request(method, url, body === undefined ? undefined : JSON.stringify(body));
    const parts = [];
    for await (const d of resp) parts.push(d);
    const text = Buffer.concat(parts).toString();
    return text ? JSON.parse(text) : undefined;
  }

  /** The JSON lines of a streamed answer. @param {string} method @param {string} url @param {string} [body] */
  async *frames(method, url, body) {
    const resp = await this.request(method, url, body);
    let buf = '';
    for await (const d of resp) {
      buf += d.toString();
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i).trim();
        buf = buf.slice(i + 1);
        if (line) yield JSON.parse(line);
      }
    }
    if (buf.trim()) yield JSON.parse(buf);
  }

  /** Starts live run runId and resolves once its agent runs. */
  async start(runId, opts = {}) {
    const req = { run_id: runId, conversation: opts.conversation ?? 'cli', task: opts.task ?? 'default',
      session: opts.session ?? 'default', keep_alive: true };
    if (opts.image) req.image = opts.image;
    if (opts.command) req.command = opts.command;
    if (opts.user) req.user = opts.user;
    if (opts.env) req.env = opts.env;
    if (opts.ports) req.ports = opts.ports;
    for await (const fr of this.frames('POST', '/v1/runs', JSON.stringify(req) + '\n')) {
      if (fr.started) return;
      if (fr.result) throw new TransportError(`live run ${runId} ended before it ran: ${fr.result.error ?? ''}`);
    }
    throw new TransportError(`live run ${runId}: the daemon answered no start`);
  }

  /** Stops live run runId (recorded CANCELLED). */
  async stop(runId) {
    await this.json('POST', `/v1/runs/${q(runId)}/cancel`);
  }

  /** Runs a command to its end: {exit, stdout, stderr}. */
  async exec(runId, argv, opts = {}) {
    const out = [];
    const err = [];
    const body = JSON.stringify({ argv, env: opts.env, cwd: opts.cwd });
    for await (const fr of this.frames('POST', `/v1/runs/${q(runId)}/exec`, body)) {
      if (fr.stdout !== undefined) out.push(Buffer.from(fr.stdout, 'base64'));
      else if (fr.stderr !== undefined) err.push(Buffer.from(fr.stderr, 'base64'));
      else if (fr.exec) {
        if (fr.exec.error) throw new TransportError(`command in run ${runId}: ${fr.exec.error}`);
        return { exit: fr.exec.exit, stdout: Buffer.concat(out), stderr: Buffer.concat(err) };
      }
    }
    throw new TransportError(`command in run ${runId} has no result`);
  }

  /** Starts a command in the background: its process ({id, ...}). */
  startProcess(runId, argv, opts = {}) {
    return this.json('POST', `/v1/runs/${q(runId)}/processes`,
      { argv, env: opts.env, cwd: opts.cwd, stdin: opts.stdin || undefined, tty: opts.tty || undefined });
  }

  /** The run's processes, oldest first. */
  processes(runId) {
    return this.json('GET', `/v1/runs/${q(runId)}/processes`);
  }

  /** One process. */
  process(runId, pid) {
    return this.json('GET', `/v1/runs/${q(runId)}/processes/${q(pid)}`);
  }

  /**
   * A process's output from offset: {stream, data, offset} chunks, to its
   * end (or what is there with follow false).
   */
  async *output(runId, pid, offset = 0, opts = {}) {
    const follow = opts.follow ?? true;
    const url = `/v1/runs/${q(runId)}/processes/${q(pid)}/output?offset=${offset}&follow=${follow}`;
    for await (const fr of this.frames('GET', url)) {
      for (const stream of ['stdout', 'stderr']) {
        if (fr[stream] !== undefined) yield { stream, data: Buffer.from(fr[stream], 'base64'), offset: fr.offset ?? 0 };
      }
      if (fr.exec) return;
    }
  }

  /** Writes data (at most 1 MiB) to a process's stdin; close closes it after. */
  async writeStdin(runId, pid, data, opts = {}) {
    const resp = await this.request('POST', `/v1/runs/${q(runId)}/processes/${q(pid)}/stdin?close=${Boolean(opts.close)}`, Buffer.from(data));
    resp.resume();
  }

  /** Sends a signal of the daemon's allow-list ("TERM", "KILL", ...). */
  async signal(runId, pid, signal) {
    await this.json('POST', `/v1/runs/${q(runId)}/processes/${q(pid)}/signal`, { signal });
  }

  /**
   * The run's declared ports, {port, path, token} each: a call to path on
   * the daemon's socket with the header X-Taskrun-Port-Token: token
   * reaches the port (docs/live-runs.md).
   */
  ports(runId) {
    return this.json('GET', `/v1/runs/${q(runId)}/ports`);
  }

  /** The run's resource usage at its last sample. */
  usage(runId) {
    return this.json('GET', `/v1/runs/${q(runId)}/usage`);
  }
}
