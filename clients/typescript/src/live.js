// Client of live runs and their processes, files and ports: on a host's
// taskrun daemon over its unix socket, or on a control plane (taskrun serve)
// over HTTP as the user of a token (node:http, no dependencies). See
// docs/live-runs.md.

import http from 'node:http';
import https from 'node:https';

import { TransportError, errorForStatus } from './index.js';

/** The daemon's socket: $TASKRUN_HOST, else root's. */
export function socketPath() {
  return process.env.TASKRUN_HOST || '/run/taskrun/taskrun.sock';
}

const q = encodeURIComponent;

export class LiveClient {
  /**
   * @param {string|{url?: string, token?: string, path?: string}} [where]
   * the daemon's socket (socketPath() by default), or {url, token}: the
   * control plane and the user's token ($TASKRUN_TOKEN by default).
   */
  constructor(where) {
    const o = typeof where === 'object' && where !== null ? where : { path: where };
    this.url = o.url ? new URL(o.url.replace(/\/+$/, '')) : undefined;
    this.token = o.token ?? process.env.TASKRUN_TOKEN ?? '';
    this.path = this.url ? '' : o.path || socketPath();
  }

  /** Where a request goes: node:http options and the module to call. */
  target(method, url, headers) {
    if (!this.url) return { mod: http, opts: { socketPath: this.path, method, path: url, headers } };
    const base = this.url.pathname.replace(/\/+$/, '');
    // One connection per call, as the Python client does: a streamed
    // answer left early (exec returns at its result) ends its connection,
    // and no call can be sent on a kept-alive socket the server is closing.
    return {
      mod: this.url.protocol === 'https:' ? https : http,
      opts: { host: this.url.hostname, port: this.url.port || undefined, method, path: base + url, agent: false,
        headers: { ...headers, Authorization: `Bearer ${this.token}` } },
    };
  }

  where() {
    return this.url ? `taskrun control plane at ${this.url.href}` : `taskrun daemon at ${this.path}`;
  }

  /**
   * One request: the response, its status checked (a refusal throws the
   * APIError subclass of its status).
   * @param {string} method @param {string} url @param {Buffer|string} [body]
   * @returns {Promise<http.IncomingMessage>}
   */
  request(method, url, body, headers = { 'Content-Type': 'application/json' }) {
    return new Promise((resolve, reject) => {
      const { mod, opts } = this.target(method, url, headers);
      const req = mod.request(opts, (resp) => {
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
        resp.on('error', (e) => reject(new TransportError(`${this.where()}: ${e.message}`)));
      });
      req.on('error', (e) => reject(new TransportError(`${this.where()}: ${e.message}`)));
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

  /**
   * Starts a live run and resolves to its ID once its agent runs. On a
   * daemon the caller names it (runId); on a control plane the control
   * plane does (pass undefined), and opts.idleTimeout (seconds) stops it
   * after that long with no call, within the worker's bound.
   */
  async start(runId, opts = {}) {
    if (this.url) return this.startOnControlPlane(runId, opts);
    if (!runId) throw new TypeError("a daemon's live run needs a runId");
    const req = { run_id: runId, conversation: opts.conversation ?? 'cli', task: opts.task ?? 'default',
      session: opts.session ?? 'default', keep_alive: true };
    if (opts.image) req.image = opts.image;
    if (opts.command) req.command = opts.command;
    if (opts.user) req.user = opts.user;
    if (opts.env) req.env = opts.env;
    if (opts.ports) req.ports = opts.ports;
    for await (const fr of this.frames('POST', '/v1/runs', JSON.stringify(req) + '\n')) {
      if (fr.started) return runId;
      if (fr.result) throw new TransportError(`live run ${runId} ended before it ran: ${fr.result.error ?? ''}`);
    }
    throw new TransportError(`live run ${runId}: the daemon answered no start`);
  }

  async startOnControlPlane(runId, opts) {
    if (runId) throw new TypeError('the control plane names its runs: start(undefined, opts) there');
    const req = { prompt: 'live run', keep_alive: true };
    if (opts.image) req.image = opts.image;
    if (opts.command) req.command = opts.command;
    if (opts.env) req.env = opts.env;
    if (opts.ports) req.ports = opts.ports;
    if (opts.idleTimeout !== undefined) req.idle_timeout_ms = Math.max(1, Math.round(opts.idleTimeout * 1000));
    const { run_id: id } = await this.json('POST', '/v1/tasks', req);
    const deadline = Date.now() + (opts.wait ?? 300) * 1000;
    for (;;) {
      const run = await this.json('GET', `/v1/runs/${q(id)}`);
      // Leased is RUNNING already; started_at says its agent runs.
      if (run.status === 'RUNNING' && run.started_at) return id;
      if (run.status !== 'QUEUED' && run.status !== 'RUNNING') throw new TransportError(`live run ${id} ended before it ran: ${run.status}`);
      if (Date.now() > deadline) throw new TransportError(`live run ${id}: not running after ${opts.wait ?? 300}s`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** The run's status on the control plane (RUNNING while live). */
  async status(runId) {
    if (!this.url) throw new TypeError('a daemon serves no run status: see its records');
    return (await this.json('GET', `/v1/runs/${q(runId)}`)).status;
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

  // The file API: paths under the run's home; a path or a symlink that
  // leads out of it is refused (BadRequestError); reads and writes are
  // bounded (16 MiB).

  fileUrl(runId, path, op) {
    const p = new URLSearchParams({ path });
    if (op) p.set('op', op);
    return `/v1/runs/${q(runId)}/files?${p}`;
  }

  /** The bytes of a regular file. */
  async readFile(runId, path) {
    const resp = await this.request('GET', this.fileUrl(runId, path));
    const parts = [];
    for await (const d of resp) parts.push(d);
    return Buffer.concat(parts);
  }

  /** Writes data to a file (created or truncated), owned by the run's user. */
  async writeFile(runId, path, data) {
    const resp = await this.request('PUT', this.fileUrl(runId, path), Buffer.from(data), { 'Content-Type': 'application/octet-stream' });
    resp.resume();
  }

  /** A directory's entries: {name, size, mode, dir, symlink, mod_time} each. */
  listFiles(runId, path = '.') {
    return this.json('GET', this.fileUrl(runId, path, 'list'));
  }

  /** A path's entry (a symlink's own). */
  stat(runId, path) {
    return this.json('GET', this.fileUrl(runId, path, 'stat'));
  }

  /** Removes a file or an empty directory. */
  async remove(runId, path) {
    await this.json('DELETE', this.fileUrl(runId, path));
  }

  /**
   * Watches a path (a directory's entries, not recursive, or a file):
   * {event, path, dir} events, event being 'watching' (first, once the
   * watch holds), 'created', 'modified', 'removed' or 'overflow' (dropped
   * events were lost). It ends when the path is removed or the run ends;
   * break out of the loop to stop it sooner. A run has at most 8 watches
   * at a time.
   */
  watch(runId, path = '.') {
    return this.frames('GET', this.fileUrl(runId, path, 'watch'));
  }

  /**
   * Calls a declared port with its token: {status, body}, whatever the
   * status.
   */
  portRequest(runId, port, path = '/', opts = {}) {
    return new Promise((resolve, reject) => {
      const url = `/v1/runs/${q(runId)}/ports/${Number(port)}/${path.replace(/^\/+/, '')}`;
      const { mod, opts: o } = this.target(opts.method ?? 'GET', url, { 'X-Taskrun-Port-Token': opts.token ?? '' });
      const req = mod.request(o, (resp) => {
        const parts = [];
        resp.on('data', (d) => parts.push(d));
        resp.on('end', () => resolve({ status: resp.statusCode ?? 0, body: Buffer.concat(parts) }));
        resp.on('error', (e) => reject(new TransportError(`port ${port} of run ${runId}: ${e.message}`)));
      });
      req.on('error', (e) => reject(new TransportError(`port ${port} of run ${runId}: ${e.message}`)));
      req.end(opts.body);
    });
  }
}
