// A stand-in for `k6 run`, for CI, where k6 cannot be installed: it runs a
// k6 script's default function once per virtual user on Node
// (node --experimental-websocket run.mjs script.js), with the k6 modules
// the soak script uses (k6, k6/execution, k6/metrics, k6/timers,
// k6/websockets) implemented after k6 v1's documented behaviour, then
// evaluates the script's thresholds as k6 does and prints a summary.
//
//   VUS=5 MOBILE_TOKEN=… URL=ws://127.0.0.1:8787/ws node --experimental-websocket loadtest/k6/shim/run.mjs loadtest/k6/soak.js
//
// Environment variables are the script's __ENV (k6 -e). Unlike k6 it runs
// exactly one iteration per VU (k6's per-vu-iterations executor with
// iterations: 1), whatever the script's scenario says, and the number of
// VUs is the first scenario's. Exit status: 0, or 99 when a threshold
// failed (as k6), or 1 when the script threw.
//
// The summary on stdout is JSON: {"metrics": {name: {type, count, sum,
// rate, p99, byTag}}, "thresholds": {"name: expr": true|false}}.
import { register } from 'node:module';
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

register('./hooks.mjs', import.meta.url);
globalThis.__ENV = { ...process.env };

const state = await import('./state.mjs');
const script = await import(pathToFileURL(resolve(process.argv[2])).href);
const options = script.options || {};
const scenario = Object.values(options.scenarios || {})[0] || {};
const vus = scenario.vus || options.vus || 1;

const setupVU = new state.VU(0);
const data = script.setup ? state.withVU(setupVU, script.setup) : undefined;
const all = [];
for (let id = 1; id <= vus; id += 1) {
  const vu = new state.VU(id);
  all.push(vu.done);
  state.withVU(vu, script.default, data);
}
await Promise.all(all);

function percentile(values, p) {
  if (values.length === 0) {
    return NaN;
  }
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

// value of one threshold aggregation: count, rate, avg, min, max, med, p(N)
function aggregate(m, agg) {
  if (!m) {
    return agg === 'count' ? 0 : NaN;
  }
  const p = agg.match(/^p\(([\d.]+)\)$/);
  switch (true) {
    case agg === 'count':
      return m.sum;
    case agg === 'rate':
      return m.n === 0 ? NaN : m.passes / m.n;
    case agg === 'avg':
      return m.n === 0 ? NaN : m.sum / m.n;
    case agg === 'min':
      return Math.min(...m.values);
    case agg === 'max':
      return Math.max(...m.values);
    case agg === 'med':
      return percentile(m.values, 50);
    case p !== null:
      return percentile(m.values, Number(p[1]));
    default:
      throw new Error(`k6 shim: unknown aggregation ${agg}`);
  }
}

const ops = {
  '==': (a, b) => a === b,
  '!=': (a, b) => a !== b,
  '<=': (a, b) => a <= b,
  '>=': (a, b) => a >= b,
  '<': (a, b) => a < b,
  '>': (a, b) => a > b,
};

const thresholds = {};
let failed = false;
for (const [name, exprs] of Object.entries(options.thresholds || {})) {
  for (const expr of exprs) {
    const e = typeof expr === 'string' ? expr : expr.threshold;
    const parts = e.match(/^\s*([a-z]+(?:\([\d.]+\))?)\s*(==|!=|<=|>=|<|>)\s*([\d.]+)\s*$/);
    if (!parts) {
      throw new Error(`k6 shim: cannot read threshold ${name}: ${e}`);
    }
    const ok = ops[parts[2]](aggregate(state.metrics.get(name), parts[1]), Number(parts[3]));
    thresholds[`${name}: ${e}`] = ok;
    failed = failed || !ok;
  }
}

const out = {};
for (const [name, m] of state.metrics) {
  out[name] = {
    type: m.type, count: m.n, sum: m.sum, byTag: m.byTag,
    rate: m.type === 'rate' && m.n > 0 ? m.passes / m.n : undefined,
    p99: m.type === 'trend' ? percentile(m.values, 99) : undefined,
  };
}
process.stdout.write(`${JSON.stringify({ metrics: out, thresholds })}\n`);
if (state.scriptErrors > 0) {
  process.exit(1);
}
process.exit(failed ? 99 : 0);
