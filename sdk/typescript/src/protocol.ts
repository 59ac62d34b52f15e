// Protocol v1 frames and limits, as the reference specifies them.

export const PROTOCOL_VERSION = 1;
export const MAX_FRAME_BYTES = 16 * 1024 * 1024;
export const MAX_TEXT_CHARS = 12000;
export const MAX_AUDIO_BYTES = 8 * 1024 * 1024;
export const MAX_MEDIA_BYTES = 8 * 1024 * 1024;
export const MEDIA_CHUNK_BYTES = 3 * 1024 * 1024;
export const MIN_MEDIA_CHUNK_BYTES = 4096;
export const MAX_MEDIA_PARTS = 2048;
export const MAX_ID_CHARS = 128;
/** The longest push token a push frame takes (the gateway's extension). */
export const MAX_PUSH_TOKEN_BYTES = 4096;

export type AvatarState = "idle" | "thinking" | "speaking";
export type MediaKindIn = "image" | "video" | "document" | "audio";
export type MediaKindOut = "image" | "voice" | "video" | "document" | "animation";
export type PromptKind = "exec_approval" | "slash_confirm" | "clarify";
export type AudioFormat = "wav" | "ogg";
/** The push services an app registers its token for: FCM (Android) or APNs (iOS). */
export type PushKind = "fcm" | "apns";
export type ErrorCode =
  | "bad_frame"
  | "auth_failed"
  | "forbidden"
  | "unsupported_frame"
  | "too_big"
  | "device_offline"
  | "auth_required"
  | "internal_error"
  /** Local only: the first connection of connect() failed (bad URL, unreachable, no ready in time). */
  | "connect_failed"
  /** Local only: connect() was cancelled by its AbortSignal. */
  | "cancelled";

export interface Device {
  id?: string;
  name?: string;
  platform?: string;
  app_version?: string;
}
export interface User {
  id?: string;
  name?: string;
}

// Client → server.
export interface HelloFrame {
  t: "hello";
  token: string;
  device?: Device;
  user?: User;
}
export interface TextFrame {
  t: "text";
  id: string;
  text: string;
}
export interface AudioFrame {
  t: "audio";
  id: string;
  format: AudioFormat;
  data: string;
  text?: string;
}
export interface MediaUpFrame {
  t: "media";
  id: string;
  kind: MediaKindIn;
  mime?: string;
  filename?: string;
  caption?: string;
  data: string;
  part?: number;
  parts?: number;
}
export interface PromptAnswerFrame {
  t: "prompt";
  prompt_id: string;
  option_id?: string;
  text?: string;
}
export interface TypingUpFrame {
  t: "typing";
}
export interface PingFrame {
  t: "ping";
  ts?: unknown;
}
export interface AckFrame {
  t: "ack";
  id: string;
}
export interface DeliverMedia {
  kind: MediaKindOut | MediaKindIn;
  mime?: string;
  filename?: string;
  data: string;
}
export interface DeliverFrame {
  t: "deliver";
  id: string;
  target?: string;
  text?: string;
  media?: DeliverMedia;
}
/** Registers (or, with an empty token, takes back) the app's push token: the gateway's extension of Protocol v1. */
export interface PushUpFrame {
  t: "push";
  kind: PushKind;
  token: string;
}
export type ClientFrame =
  | HelloFrame
  | TextFrame
  | AudioFrame
  | MediaUpFrame
  | PromptAnswerFrame
  | TypingUpFrame
  | PingFrame
  | AckFrame
  | DeliverFrame
  | PushUpFrame;

// Server → client.
export interface Capabilities {
  text: boolean;
  voice: boolean;
  typing: boolean;
  avatar_states: AvatarState[];
  media_in: MediaKindIn[];
  media_out: MediaKindOut[];
  prompts: PromptKind[];
  edit: boolean;
  max_media_bytes: number;
  max_text_chars: number;
  /** The push kinds the gateway sends, which the app may register (absent: none, or a gateway without push frames). */
  push?: PushKind[];
}
export interface ReadyFrame {
  t: "ready";
  v: number;
  session: string;
  device: { id: string; name: string };
  avatar_url: string;
  capabilities: Capabilities;
}
export interface MessageFrame {
  t: "message";
  id: string;
  text: string;
  chunk: { index: number; total: number };
  final: boolean;
  edit?: boolean;
}
export interface MediaDownFrame {
  t: "media";
  id: string;
  kind: MediaKindOut;
  mime: string;
  filename: string;
  caption?: string;
  part: number;
  parts: number;
  final: boolean;
  size: number;
  data?: string;
  url?: string;
  reply_to?: string;
}
export interface PromptOption {
  id: string;
  label: string;
  style?: "primary" | "danger" | "";
}
export interface PromptFrame {
  t: "prompt";
  id: string;
  kind: PromptKind;
  text: string;
  options: PromptOption[];
  command?: string;
  description?: string;
  session: string;
  timeout_seconds: number;
}
export interface PromptDoneFrame {
  t: "prompt_done";
  id: string;
  option_id?: string;
  expired?: boolean;
}
export interface AvatarFrame {
  t: "avatar";
  state: AvatarState;
  mood?: string;
}
export interface TypingDownFrame {
  t: "typing";
  stop?: boolean;
}
export interface PongFrame {
  t: "pong";
  ts?: unknown;
}
export interface ErrorFrame {
  t: "error";
  code: ErrorCode | string;
  message: string;
  fatal: boolean;
}
export interface DeliveredFrame {
  t: "delivered";
  id: string;
  device: string;
}
/** The answer to a push frame: the token of kind was registered, or taken back. */
export interface PushFrame {
  t: "push";
  kind: PushKind;
  registered: boolean;
}
export type ServerFrame =
  | ReadyFrame
  | MessageFrame
  | MediaDownFrame
  | PromptFrame
  | PromptDoneFrame
  | AvatarFrame
  | TypingDownFrame
  | PongFrame
  | ErrorFrame
  | DeliveredFrame
  | PushFrame;

/** An error from the gateway (remote) or found before sending (local). */
export class HermesError extends Error {
  readonly code: ErrorCode | string;
  readonly fatal: boolean;
  readonly local: boolean;
  /** The id of the text, file or delivery that failed, when the client can tell. */
  readonly id?: string;
  constructor(code: ErrorCode | string, message: string, opts: { fatal?: boolean; local?: boolean; id?: string } = {}) {
    super(`${code}: ${message}`);
    this.name = "HermesError";
    this.code = code;
    this.fatal = !!opts.fatal;
    this.local = !!opts.local;
    if (opts.id) this.id = opts.id;
  }
  /** Errors after which the client does not reconnect: retrying as is cannot help. */
  get permanent(): boolean {
    return this.code === "auth_failed" || this.code === "forbidden";
  }
}

/** Number of characters as the gateway counts them (code points). */
export function charCount(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

const B64 = typeof (globalThis as any).Buffer === "function" ? (globalThis as any).Buffer : null;

export function toBase64(b: Uint8Array): string {
  if (B64) return B64.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode.apply(null, b.subarray(i, i + 0x8000) as any);
  return btoa(s);
}

export function fromBase64(s: string): Uint8Array {
  if (B64) {
    const buf = B64.from(s, "base64");
    return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  }
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** A random id (hex), also where crypto.randomUUID is not offered. */
export function newId(prefix = ""): string {
  const b = new Uint8Array(12);
  globalThis.crypto.getRandomValues(b);
  return prefix + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
