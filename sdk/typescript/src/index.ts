export * from "./protocol.js";
export * from "./backoff.js";
export * from "./client.js";
