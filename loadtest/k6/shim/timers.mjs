// k6/timers: timers that keep their VU's iteration alive until they fire
// (setTimeout) or are cleared.
import { currentVU, withVU } from './state.mjs';

const live = new Map(); // handle -> VU

export function setTimeout(fn, ms, ...args) {
  const vu = currentVU();
  vu.hold();
  const h = globalThis.setTimeout(() => {
    live.delete(h);
    vu.release();
    withVU(vu, fn, ...args);
  }, ms);
  live.set(h, vu);
  return h;
}

export function setInterval(fn, ms, ...args) {
  const vu = currentVU();
  vu.hold();
  const h = globalThis.setInterval(() => withVU(vu, fn, ...args), ms);
  live.set(h, vu);
  return h;
}

function clear(h, clearFn) {
  clearFn(h);
  const vu = live.get(h);
  if (vu) {
    live.delete(h);
    vu.release();
    vu.settle();
  }
}

export function clearTimeout(h) {
  clear(h, globalThis.clearTimeout);
}

export function clearInterval(h) {
  clear(h, globalThis.clearInterval);
}
