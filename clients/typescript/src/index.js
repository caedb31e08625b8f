// Client of the taskrun control plane's user API, for Node 20 or later
// (global fetch, no dependency). Plain ESM JavaScript with JSDoc types; the
// declarations for TypeScript are in ../index.d.ts. See the README.

/** Every status a run can have. */
export const STATUSES = Object.freeze(['QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED']);
/** The statuses a run ends in. */
export const TERMINAL_STATUSES = Object.freeze(['SUCCEEDED', 'FAILED', 'CANCELLED']);

const ID = /^[A-Za-z0-9_-]{1,128}$/;

/** Base class of every error this package throws. */
export class TaskrunError extends Error {
  /** @param {string} message @param {{cause?: unknown}} [opts] */
  constructor(message, opts) {
    super(message, opts);
    this.name = new.target.name;
  }
}

/** The control plane could not be reached, or the connection broke. */
export class TransportError extends TaskrunError {}

/**
 * The control plane answered with an unexpected HTTP status. `status` is
 * the code, `message` the server's own message (its JSON `error` field),
 * `retryAfter` the seconds of its Retry-After header, if any.
 */
export class APIError extends TaskrunError {
  /**
   * @param {number} status
   * @param {string} message
   * @param {{retryAfter?: number, method?: string, url?: string}} [info]
   */
  constructor(status, message, info = {}) {
    super(`control plane answered ${status}: ${message}`);
    this.status = status;
    this.serverMessage = message;
    this.retryAfter = info.retryAfter;
    this.method = info.method ?? '';
    this.url = info.url ?? '';
  }
}
/** 400: a field of the request is invalid; the message names it. */
export class BadRequestError extends APIError {}
/** 401: the token is missing or unknown. */
export class AuthenticationError extends APIError {}
/** 403: the token may not use this endpoint (a worker token on the user API). */
export class PermissionDeniedError extends APIError {}
/** 404: no such run, or another user's (the server does not tell them apart). */
export class NotFoundError extends APIError {}
/** 409: the request conflicts with the run's state (cancelling an ended run). */
export class ConflictError extends APIError {}
/** 413: the task's JSON or the workspace archive is over a cap. */
export class PayloadTooLargeError extends APIError {}
/** 415: the body's content type is refused. */
export class UnsupportedMediaTypeError extends APIError {}
/** 429: too many queued runs or readers; see `retryAfter`. */
export class RateLimitError extends APIError {}
/** 5xx: the control plane failed. */
export class ServerError extends APIError {}

/** `wait` gave up before the run ended; `run` is the run as last seen. */
export class WaitTimeoutError extends TaskrunError {
  /** @param {string} runId @param {number} timeoutMs @param {import('../index.js').Run | undefined} run */
  constructor(runId, timeoutMs, run) {
    super(`run ${runId} did not end within ${timeoutMs} ms (last status ${run?.status ?? 'unknown'})`);
    this.runId = runId;
    this.run = run;
  }
}

/** @type {Record<number, typeof APIError>} */
const BY_STATUS = {
  400: BadRequestError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLargeError,
  415: UnsupportedMediaTypeError,
  429: RateLimitError,
};

/**
 * The APIError subclass instance for an HTTP status.
 * @param {number} status @param {string} message
 * @param {{retryAfter?: number, method?: string, url?: string}} [info]
 * @returns {APIError}
 */
export function errorForStatus(status, message, info) {
  const Cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : APIError);
  return new Cls(status, message, info);
}

/** @param {string} id */
function checkId(id) {
  if (typeof id !== 'string' || !ID.test(id)) {
    throw new TypeError(`run ID ${JSON.stringify(id)}: IDs are 1 to 128 of A-Z a-z 0-9 _ -`);
  }
  return id;
}

/** @param {string | null} v @returns {number | undefined} */
function retryAfter(v) {
  if (!v) return undefined;
  const n = Number(v);
  if (Number.isFinite(n)) return Math.max(0, n);
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, (t - Date.now()) / 1000);
}

/** @param {number} ms @param {AbortSignal} [signal] */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(done, ms);
    function done() {
      signal?.removeEventListener('abort', onAbort);
      resolve(undefined);
    }
    function onAbort() {
      clearTimeout(t);
      reject(signal?.reason);
    }
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * A client of one taskrun control plane, acting with one user token.
 */
export class Client {
  /** The user token: a private field, so logging a client does not show it. */
  #token;

  /**
   * @param {string} baseUrl the control plane, http://HOST:PORT or https://HOST
   * @param {string} token a user token
   * @param {{timeoutMs?: number}} [options] timeoutMs: how long a request
   *   waits for the answer's headers (default 30000); a follow is not cut.
   */
  constructor(baseUrl, token, options = {}) {
    let u;
    try {
      u = new URL(baseUrl);
    } catch {
      u = undefined;
    }
    if (!u || (u.protocol !== 'http:' && u.protocol !== 'https:') || !u.host) {
      throw new TypeError(`server URL ${JSON.stringify(baseUrl)}: give http://HOST:PORT or https://HOST`);
    }
    if (!token) throw new TypeError('no token: pass a user token (e.g. $TASKRUN_TOKEN)');
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.#token = token;
    this.timeoutMs = options.timeoutMs ?? 30000;
  }

  /**
   * Send a request; return the response when its status is `expect`, else
   * throw the matching APIError.
   * @private
   * @param {string} method @param {string} path
   * @param {{query?: Record<string, string | number | undefined>, body?: BodyInit, contentType?: string, expect?: number, signal?: AbortSignal}} [opts]
   * @returns {Promise<Response>}
   */
  async open(method, path, opts = {}) {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(opts.query ?? {})) {
      if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
    }
    /** @type {Record<string, string>} */
    const headers = { Authorization: `Bearer ${this.#token}`, 'User-Agent': 'taskrun-js-client' };
    if (opts.contentType) headers['Content-Type'] = opts.contentType;
    // The timeout bounds the wait for the answer's headers only.
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(new Error(`no answer within ${this.timeoutMs} ms`)), this.timeoutMs);
    const onAbort = () => ctl.abort(opts.signal?.reason);
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    if (opts.signal?.aborted) onAbort();
    /** @type {Response} */
    let resp;
    try {
      resp = await fetch(url, { method, headers, body: opts.body, signal: ctl.signal, redirect: 'error' });
    } catch (e) {
      opts.signal?.removeEventListener('abort', onAbort);
      if (opts.signal?.aborted) throw opts.signal.reason;
      throw new TransportError(`${method} ${url}: ${/** @type {Error} */ (e).cause ?? e}`, { cause: e });
    } finally {
      clearTimeout(timer);
    }
    if (resp.status !== (opts.expect ?? 200)) {
      opts.signal?.removeEventListener('abort', onAbort);
      throw await apiError(resp, method, url.toString());
    }
    return resp;
  }

  /** @private @param {string} method @param {string} path @param {Parameters<Client['open']>[2]} [opts] */
  async json(method, path, opts) {
    const resp = await this.open(method, path, opts);
    try {
      return await resp.json();
    } catch (e) {
      throw new TransportError(`${method} ${path}: reading the answer: ${e}`, { cause: e });
    }
  }

  /**
   * Submit a task: creates it and its first run, QUEUED.
   * @param {import('../index.js').SubmitRequest} task
   * @param {{workspace?: Blob | Uint8Array | ArrayBuffer, signal?: AbortSignal}} [opts]
   *   workspace: a gzip'd tar of the starting workspace.
   * @returns {Promise<import('../index.js').Submission>}
   */
  async submit(task, opts = {}) {
    /** @type {Record<string, unknown>} */
    const t = { ...task };
    if (t.env && !Array.isArray(t.env)) {
      t.env = Object.entries(/** @type {Record<string, string>} */ (t.env)).map(([k, v]) => `${k}=${v}`);
    }
    if (t.previous_run_id !== undefined) checkId(/** @type {string} */ (t.previous_run_id));
    const body = JSON.stringify(t);
    if (opts.workspace === undefined) {
      return this.json('POST', '/v1/tasks', { body, contentType: 'application/json', expect: 201, signal: opts.signal });
    }
    const form = new FormData();
    form.append('task', new Blob([body], { type: 'application/json' }));
    const ws = opts.workspace instanceof Blob ? opts.workspace : new Blob([opts.workspace], { type: 'application/gzip' });
    form.append('workspace', ws, 'workspace.tar.gz');
    // fetch sets the multipart Content-Type with its boundary.
    return this.json('POST', '/v1/tasks', { body: form, expect: 201, signal: opts.signal });
  }

  /**
   * One of your runs. Throws NotFoundError for an unknown run or another user's.
   * @param {string} runId @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<import('../index.js').Run>}
   */
  async get(runId, opts = {}) {
    return this.json('GET', `/v1/runs/${checkId(runId)}`, { signal: opts.signal });
  }

  /**
   * Your runs, newest first, without their output and prompt.
   * @param {{status?: import('../index.js').RunStatus, limit?: number, signal?: AbortSignal}} [opts]
   * @returns {Promise<import('../index.js').Run[]>}
   */
  async listRuns(opts = {}) {
    const d = await this.json('GET', '/v1/runs', {
      query: { status: opts.status?.toUpperCase(), limit: opts.limit },
      signal: opts.signal,
    });
    return d.runs ?? [];
  }

  /**
   * Cancel a run and return it: a QUEUED run ends CANCELLED at once, a
   * RUNNING one is flagged and its worker stops it. ConflictError (409) when
   * the run had already ended.
   * @param {string} runId @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<import('../index.js').Run>}
   */
  async cancel(runId, opts = {}) {
    return this.json('POST', `/v1/runs/${checkId(runId)}/cancel`, { signal: opts.signal });
  }

  /**
   * The run's record as its worker stored it (what `taskrun inspect --json`
   * prints). NotFoundError for another user's run, or one with none stored yet.
   * @param {string} runId @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<Record<string, unknown>>}
   */
  async record(runId, opts = {}) {
    return this.json('GET', `/v1/runs/${checkId(runId)}/record`, { signal: opts.signal });
  }

  /**
   * What the run changed in its workspace, as a git patch (changes.patch).
   * @param {string} runId @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<Uint8Array>}
   */
  async patch(runId, opts = {}) {
    return this.bytes(`/v1/runs/${checkId(runId)}/patch`, opts.signal);
  }

  /**
   * The run's change list (changes.json).
   * @param {string} runId @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<Record<string, unknown>>}
   */
  async changes(runId, opts = {}) {
    return this.json('GET', `/v1/runs/${checkId(runId)}/changes`, { signal: opts.signal });
  }

  /**
   * One file the run stored, named as `taskrun cp` names it: artifacts/PATH,
   * output/result.md, home/PATH or another object its record lists. Throws a
   * TypeError for a path that is not clean and relative.
   * @param {string} runId @param {string} path @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<Uint8Array>}
   */
  async file(runId, path, opts = {}) {
    const parts = String(path).split('/');
    if (parts.some((p) => p === '' || p === '.' || p === '..' || p.includes('\\'))) {
      throw new TypeError(`path ${JSON.stringify(path)}: give a clean relative path such as artifacts/report.md`);
    }
    return this.bytes(`/v1/runs/${checkId(runId)}/files/${parts.map(encodeURIComponent).join('/')}`, opts.signal);
  }

  /** @private @param {string} path @param {AbortSignal} [signal] */
  async bytes(path, signal) {
    const resp = await this.open('GET', path, { signal });
    try {
      return new Uint8Array(await resp.arrayBuffer());
    } catch (e) {
      throw new TransportError(`GET ${path}: reading the answer: ${e}`, { cause: e });
    }
  }

  /**
   * The workers heard from in the last 24 hours, most recently seen first.
   * @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<import('../index.js').Worker[]>}
   */
  async workers(opts = {}) {
    const d = await this.json('GET', '/v1/workers', { signal: opts.signal });
    return d.workers ?? [];
  }

  /**
   * The run's output held now, from byte `offset`.
   * @param {string} runId @param {number} [offset]
   * @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<Uint8Array>}
   */
  async readOutput(runId, offset = 0, opts = {}) {
    /** @type {Uint8Array[]} */
    const parts = [];
    for await (const c of this.output(runId, offset, false, opts.signal)) parts.push(c.data);
    return concat(parts);
  }

  /**
   * The run's output from byte `offset` as it arrives, until the worker ends
   * the stream (or the run is over without ending it). A dropped connection
   * is resumed at the offset reached; after `maxReconnects` failures in a
   * row without a byte received, the last error is thrown.
   * @param {string} runId @param {number} [offset]
   * @param {{maxReconnects?: number, signal?: AbortSignal}} [opts]
   * @returns {AsyncGenerator<import('../index.js').OutputChunk, void, undefined>}
   */
  async *follow(runId, offset = 0, opts = {}) {
    checkId(runId);
    if (!Number.isInteger(offset) || offset < 0) throw new RangeError('offset: a byte offset, 0 or more');
    const max = opts.maxReconnects ?? 5;
    let failures = 0;
    for (;;) {
      // A connection that opened and later went quiet or broke (undici cuts
      // a body silent for 5 minutes) is resumed without counting a failure.
      const state = { opened: false };
      try {
        for await (const c of this.output(runId, offset, true, opts.signal, state)) {
          offset = c.offset + c.data.length;
          failures = 0;
          yield c;
        }
        return;
      } catch (e) {
        if (!(e instanceof TransportError) || opts.signal?.aborted) throw e;
        failures = state.opened ? 1 : failures + 1;
        if (failures > max) throw e;
        await sleep(Math.min(200 * 2 ** (failures - 1), 5000), opts.signal);
      }
    }
  }

  /**
   * @private
   * @param {string} runId @param {number} offset @param {boolean} follow @param {AbortSignal} [signal]
   * @param {{opened: boolean}} [state] set opened once the answer's headers came
   * @returns {AsyncGenerator<import('../index.js').OutputChunk, void, undefined>}
   */
  async *output(runId, offset, follow, signal, state) {
    const path = `/v1/runs/${checkId(runId)}/output`;
    const resp = await this.open('GET', path, { query: { offset, follow: follow ? '1' : undefined }, signal });
    if (state) state.opened = true;
    if (!resp.body) return;
    const reader = resp.body.getReader();
    try {
      for (;;) {
        /** @type {ReadableStreamReadResult<Uint8Array>} */
        let r;
        try {
          r = await reader.read();
        } catch (e) {
          if (signal?.aborted) throw signal.reason;
          throw new TransportError(`GET ${path}: stream broke at offset ${offset}: ${e}`, { cause: e });
        }
        if (r.done) return;
        if (r.value.length === 0) continue;
        yield { offset, data: r.value };
        offset += r.value.length;
      }
    } finally {
      await reader.cancel().catch(() => {});
    }
  }

  /**
   * Poll the run until it ends, and return it. Throws WaitTimeoutError
   * after `timeoutMs` (no limit when absent).
   * @param {string} runId
   * @param {{timeoutMs?: number, pollIntervalMs?: number, signal?: AbortSignal}} [opts]
   * @returns {Promise<import('../index.js').Run>}
   */
  async wait(runId, opts = {}) {
    const interval = opts.pollIntervalMs ?? 1000;
    const deadline = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
    for (;;) {
      const run = await this.get(runId, { signal: opts.signal });
      if (TERMINAL_STATUSES.includes(run.status)) return run;
      const left = deadline - Date.now();
      if (left <= 0) throw new WaitTimeoutError(runId, opts.timeoutMs ?? 0, run);
      await sleep(Math.min(interval, left), opts.signal);
    }
  }
}

/** @param {Uint8Array[]} parts */
function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** @param {Response} resp @param {string} method @param {string} url */
async function apiError(resp, method, url) {
  let message = '';
  const ctype = resp.headers.get('Content-Type') ?? '';
  let text = '';
  try {
    text = (await resp.text()).slice(0, 8192);
  } catch {
    text = '';
  }
  if (ctype.includes('json')) {
    try {
      message = String(JSON.parse(text).error ?? '');
    } catch {
      message = '';
    }
  }
  if (!message && ctype.startsWith('text/plain')) message = text.trim();
  if (!message) message = resp.statusText || `HTTP ${resp.status}`;
  return errorForStatus(resp.status, message, {
    retryAfter: retryAfter(resp.headers.get('Retry-After')),
    method,
    url,
  });
}

export { LiveClient, socketPath } from './live.js';
