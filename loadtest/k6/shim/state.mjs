// The shim's shared state: virtual users, the handles that keep their
// iterations alive, and the metrics. See run.mjs.

// A VU runs one iteration of the script's default function. The iteration
// ends, as in k6, once nothing of it is pending: no timer, no open socket.
export class VU {
  constructor(id) {
    this.id = id;
    this.handles = 0;
    this.done = new Promise((resolve) => {
      this.resolve = resolve;
    });
  }

  hold() {
    this.handles += 1;
  }

  release() {
    this.handles -= 1;
  }

  settle() {
    if (this.handles <= 0) {
      this.resolve();
    }
  }
}

let current = null;

// currentVU is the VU whose code runs now (k6 runs a VU's callbacks on its
// own event loop; here every callback enters through withVU).
export function currentVU() {
  if (current === null) {
    throw new Error('k6 shim: called outside a VU');
  }
  return current;
}

export let scriptErrors = 0;

// withVU runs fn as vu's code, then ends vu's iteration if nothing of it is
// pending. An exception ends nothing by itself: it is counted and printed,
// as k6 prints an uncaught exception of a callback.
export function withVU(vu, fn, ...args) {
  const prev = current;
  current = vu;
  try {
    return fn(...args);
  } catch (e) {
    scriptErrors += 1;
    console.error(`k6 shim: VU ${vu.id}: ${e && e.stack ? e.stack : e}`);
    return undefined;
  } finally {
    current = prev;
    vu.settle();
  }
}

// metrics: name -> { type, sum, n, values, byTag }
export const metrics = new Map();

export function metric(name, type) {
  let m = metrics.get(name);
  if (!m) {
    m = { type, sum: 0, n: 0, passes: 0, values: [], byTag: {} };
    metrics.set(name, m);
  }
  return m;
}

// record adds one sample; counters print their running total on stderr
// ("k6shim <name> <total>") so that a test can wait for progress.
export function record(name, type, value, tags) {
  const m = metric(name, type);
  m.n += 1;
  m.sum += value;
  if (type === 'trend') {
    m.values.push(value);
  }
  if (type === 'rate' && value) {
    m.passes += 1;
  }
  for (const [k, v] of Object.entries(tags || {})) {
    const key = `${k}:${v}`;
    m.byTag[key] = (m.byTag[key] || 0) + value;
  }
  if (type === 'counter') {
    process.stderr.write(`k6shim ${name} ${m.sum}\n`);
  }
}
