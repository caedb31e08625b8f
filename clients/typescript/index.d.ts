// Type declarations of the taskrun user API client (src/index.js), written
// by hand: the package is plain ESM JavaScript so that it runs on Node 20
// without a compiler. Keep them in step with src/index.js.

/** A run's status: QUEUED → RUNNING → SUCCEEDED | FAILED | CANCELLED. */
export type RunStatus = 'QUEUED' | 'RUNNING' | 'SUCCEEDED' | 'FAILED' | 'CANCELLED';

export declare const STATUSES: readonly RunStatus[];
export declare const TERMINAL_STATUSES: readonly RunStatus[];

/** Resource limits of a run; each within the operator's maxima. */
export interface Limits {
  timeout_ms?: number;
  memory_bytes?: number;
  cpus?: number;
  pids?: number;
  disk_bytes?: number;
  max_output_bytes?: number;
  max_tokens?: number;
}

/** The egress a run asks for (granted within the worker's policy). */
export interface EgressRequest {
  rules?: { host: string; port?: number }[];
  credentials?: { id: string }[];
  max_bytes?: number;
  max_connections?: number;
}

/** A task, as POST /v1/tasks takes it. Only `prompt` is required. */
export interface SubmitRequest {
  prompt: string;
  conversation_id?: string;
  session_id?: string;
  previous_run_id?: string;
  model?: string;
  image?: string;
  runtime?: string;
  command?: string[];
  /** NAME=VALUE strings, or names to values. */
  env?: string[] | Record<string, string>;
  limits?: Limits;
  egress?: EgressRequest;
  retryable?: boolean;
}

/** An object in the control plane's shared store. */
export interface StoredObject {
  key: string;
  size: number;
  sha256: string;
  content_type?: string;
}

/** The answer to a submission (201). */
export interface Submission {
  task_id: string;
  run_id: string;
  status: RunStatus;
  workspace?: StoredObject;
}

/** One run, as GET /v1/runs/{id} answers it (times are RFC 3339 strings). */
export interface Run {
  id: string;
  task: { id: string; user_id: string; conversation_id: string; prompt: string };
  session_id: string;
  previous_run_id?: string;
  spec: { model?: string; image?: string; runtime?: string; limits?: Limits; workspace?: StoredObject; [k: string]: unknown };
  status: RunStatus;
  created_at: string;
  leased_at?: string;
  started_at?: string;
  ended_at?: string;
  worker_id?: string;
  epoch: number;
  lease_expires_at?: string;
  cancel_requested?: boolean;
  attempts: number;
  exit_code?: number;
  error?: string;
  prompt_tokens: number;
  completion_tokens: number;
  /** The output the worker reported, at most 128 KiB (absent in lists). */
  output?: string;
  output_truncated?: boolean;
  trace_path?: string;
  artifact?: StoredObject;
  changes?: Record<string, unknown>;
  container?: { id: string; image_digest?: string; runtime?: string };
  /** Bytes of the output stream held; whether the worker ended it. */
  stream_next: number;
  stream_ended: boolean;
}

/** A worker heard from lately. */
export interface Worker {
  id: string;
  capacity: { slots: number; free_slots: number; free_memory_bytes: number; free_disk_bytes: number };
  labels: Record<string, unknown>;
  last_seen: string;
}

/** A piece of a run's output stream: `data` starts at byte `offset`. */
export interface OutputChunk {
  offset: number;
  data: Uint8Array;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export declare class TaskrunError extends Error {}
/** The control plane could not be reached, or the connection broke. */
export declare class TransportError extends TaskrunError {}
/** An unexpected HTTP status; `serverMessage` is the server's own message. */
export declare class APIError extends TaskrunError {
  constructor(status: number, message: string, info?: { retryAfter?: number; method?: string; url?: string });
  readonly status: number;
  readonly serverMessage: string;
  /** Seconds, from Retry-After. */
  readonly retryAfter?: number;
  readonly method: string;
  readonly url: string;
}
export declare class BadRequestError extends APIError {}
export declare class AuthenticationError extends APIError {}
export declare class PermissionDeniedError extends APIError {}
export declare class NotFoundError extends APIError {}
export declare class ConflictError extends APIError {}
export declare class PayloadTooLargeError extends APIError {}
export declare class UnsupportedMediaTypeError extends APIError {}
export declare class RateLimitError extends APIError {}
export declare class ServerError extends APIError {}
export declare class WaitTimeoutError extends TaskrunError {
  readonly runId: string;
  readonly run?: Run;
}

export declare function errorForStatus(
  status: number,
  message: string,
  info?: { retryAfter?: number; method?: string; url?: string },
): APIError;

export declare class Client {
  /** timeoutMs bounds the wait for each answer's headers (default 30000). */
  constructor(baseUrl: string, token: string, options?: { timeoutMs?: number });
  readonly baseUrl: string;
  readonly timeoutMs: number;
  submit(task: SubmitRequest, opts?: CallOptions & { workspace?: Blob | Uint8Array | ArrayBuffer }): Promise<Submission>;
  get(runId: string, opts?: CallOptions): Promise<Run>;
  listRuns(opts?: CallOptions & { status?: RunStatus; limit?: number }): Promise<Run[]>;
  cancel(runId: string, opts?: CallOptions): Promise<Run>;
  workers(opts?: CallOptions): Promise<Worker[]>;
  record(runId: string, opts?: CallOptions): Promise<Record<string, unknown>>;
  patch(runId: string, opts?: CallOptions): Promise<Uint8Array>;
  changes(runId: string, opts?: CallOptions): Promise<Record<string, unknown>>;
  file(runId: string, path: string, opts?: CallOptions): Promise<Uint8Array>;
  readOutput(runId: string, offset?: number, opts?: CallOptions): Promise<Uint8Array>;
  follow(runId: string, offset?: number, opts?: CallOptions & { maxReconnects?: number }): AsyncGenerator<OutputChunk, void, undefined>;
  wait(runId: string, opts?: CallOptions & { timeoutMs?: number; pollIntervalMs?: number }): Promise<Run>;
}

/** A process of a live run (docs/live-runs.md). */
export interface ProcessInfo {
  id: string;
  argv: string[];
  cwd: string;
  stdin?: boolean;
  tty?: boolean;
  started_at: string;
  running: boolean;
  result?: { exit: number; error?: string };
  output_bytes: number;
  output_from: number;
}

/** A live run's resource usage at its last sample. */
export interface Usage {
  cpu_seconds: number;
  peak_memory_bytes: number;
  read_bytes: number;
  write_bytes: number;
  peak_pids: number;
  samples: number;
}

/** A live run's declared port: the path it answers on and its token. */
export interface PortInfo {
  port: number;
  path: string;
  token: string;
}

/** The daemon's socket: $TASKRUN_HOST, else root's. */
export declare function socketPath(): string;

/** A path's entry in a live run's home (the file API). */
/** One event of a file watch; path is relative to the run's home. */
export interface WatchEvent {
  event: 'watching' | 'created' | 'modified' | 'removed' | 'overflow';
  path?: string;
  dir?: boolean;
  dropped?: number;
}

export interface FileInfo {
  name: string;
  size: number;
  mode: string;
  dir?: boolean;
  symlink?: boolean;
  mod_time: string;
}

/**
 * Client of live runs: on a host's taskrun daemon (its socket), or on a
 * control plane ({url, token}) for the keep-alive runs its workers hold.
 */
export declare class LiveClient {
  constructor(where?: string | { url?: string; token?: string; path?: string });
  readonly path: string;
  readonly url?: URL;
  /** Resolves to the run's ID once it runs; on a control plane pass runId undefined. */
  start(runId: string | undefined, opts?: { image?: string; command?: string[]; user?: string; env?: string[]; conversation?: string; task?: string; session?: string; ports?: number[]; idleTimeout?: number; wait?: number }): Promise<string>;
  status(runId: string): Promise<string>;
  stop(runId: string): Promise<void>;
  exec(runId: string, argv: string[], opts?: { env?: string[]; cwd?: string }): Promise<{ exit: number; stdout: Uint8Array; stderr: Uint8Array }>;
  startProcess(runId: string, argv: string[], opts?: { env?: string[]; cwd?: string; stdin?: boolean; tty?: boolean }): Promise<ProcessInfo>;
  processes(runId: string): Promise<ProcessInfo[]>;
  process(runId: string, pid: string): Promise<ProcessInfo>;
  output(runId: string, pid: string, offset?: number, opts?: { follow?: boolean }): AsyncGenerator<{ stream: 'stdout' | 'stderr'; data: Uint8Array; offset: number }, void, undefined>;
  writeStdin(runId: string, pid: string, data: Uint8Array | string, opts?: { close?: boolean }): Promise<void>;
  signal(runId: string, pid: string, signal: string): Promise<void>;
  usage(runId: string): Promise<Usage>;
  ports(runId: string): Promise<PortInfo[]>;
  readFile(runId: string, path: string): Promise<Uint8Array>;
  writeFile(runId: string, path: string, data: Uint8Array | string): Promise<void>;
  listFiles(runId: string, path?: string): Promise<FileInfo[]>;
  stat(runId: string, path: string): Promise<FileInfo>;
  remove(runId: string, path: string): Promise<void>;
  watch(runId: string, path?: string): AsyncGenerator<WatchEvent, void, undefined>;
  portRequest(runId: string, port: number, path?: string, opts?: { token?: string; method?: string; body?: Uint8Array | string }): Promise<{ status: number; body: Uint8Array }>;
}
