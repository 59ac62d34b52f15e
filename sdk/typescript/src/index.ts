export * from "./protocol.js";
export * from "./client.js";
