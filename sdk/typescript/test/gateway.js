// Starts a real gateway for the tests: services/edge built from this
// repository (or MOBILE_TEST_EDGE_BIN), zero-config single node with the
// demo agent, on a free loopback port.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes, generateKeyPairSync } from "node:crypto";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

function edgeBinary() {
  if (process.env.MOBILE_TEST_EDGE_BIN) return { bin: process.env.MOBILE_TEST_EDGE_BIN, dir: null };
  const dir = mkdtempSync(join(tmpdir(), "hermes-edge-"));
  const bin = join(dir, "edge");
  execFileSync("go", ["build", "-o", bin, "./services/edge"], { cwd: repo, stdio: "inherit" });
  return { bin, dir };
}

function cleanEnv() {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(MOBILE_|NATS_|REDIS_|OTEL_)/.test(k) || k === "AGENT") continue;
    env[k] = v;
  }
  return env;
}

/**
 * Settings that turn FCM and APNs on with throwaway credentials (a
 * service account's key file, an APNs .p8 key): push frames are taken and
 * ready offers both kinds. Nothing is sent while the phones are connected.
 */
export function pushEnv() {
  const pem = (type, opts) => generateKeyPairSync(type, { ...opts, privateKeyEncoding: { type: "pkcs8", format: "pem" }, publicKeyEncoding: { type: "spki", format: "pem" } }).privateKey;
  const serviceAccount = {
    type: "service_account",
    project_id: "hermes-sdk-test",
    private_key_id: randomBytes(20).toString("hex"),
    private_key: pem("rsa", { modulusLength: 2048 }),
    client_email: "firebase-adminsdk@hermes-sdk-test.iam.gserviceaccount.com",
    token_uri: "https://oauth2.googleapis.com/token",
  };
  return {
    MOBILE_PUSH_FCM_CREDENTIALS: JSON.stringify(serviceAccount),
    MOBILE_PUSH_APNS_KEY: pem("ec", { namedCurve: "P-256" }),
    MOBILE_PUSH_APNS_KEY_ID: "ABC123DEFG",
    MOBILE_PUSH_APNS_TEAM_ID: "TEAM123456",
    MOBILE_PUSH_APNS_TOPIC: "org.hermes.sdk.test",
    MOBILE_PUSH_APNS_ENV: "sandbox",
  };
}

/** Starts the gateway; resolves with {ws, http, token, stop()}. */
export async function startGateway(extraEnv = {}) {
  const { bin, dir } = edgeBinary();
  const token = "app-" + randomBytes(12).toString("hex");
  const proc = spawn(bin, [], {
    env: { ...cleanEnv(), MOBILE_TOKEN: token, MOBILE_LISTEN: "127.0.0.1:0", MOBILE_ADMIN_LISTEN: "off", MOBILE_DRAIN_WINDOW: "1", ...extraEnv },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no 'gateway listening' within 20 s:\n" + log)), 20000);
    const onData = (b) => {
      log += b.toString();
      for (const line of log.split("\n")) {
        if (!line.includes("gateway listening")) continue;
        try {
          const url = JSON.parse(line).url;
          clearTimeout(timer);
          resolve(url);
          return;
        } catch {}
      }
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.on("exit", (code) => reject(new Error(`edge exited (${code}):\n${log}`)));
  });
  proc.stderr.on("data", (b) => (log += b.toString()));
  const http = url.replace(/^ws:/, "http:").replace(/\/ws$/, "");
  return {
    ws: url,
    http,
    token,
    log: () => log,
    async stop() {
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 10000);
      await exited;
      clearTimeout(t);
      if (dir) rmSync(dir, { recursive: true, force: true });
    },
  };
}
