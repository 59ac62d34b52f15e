// k6: check, as k6 v1 has it: every named check adds a sample to the
// "checks" rate; the result is whether all passed.
import { record } from './state.mjs';

export function check(value, sets, tags) {
  let all = true;
  for (const [name, fn] of Object.entries(sets)) {
    let ok = false;
    try {
      ok = Boolean(typeof fn === 'function' ? fn(value) : fn);
    } catch {
      ok = false;
    }
    record('checks', 'rate', ok ? 1 : 0, { check: name, ...(tags || {}) });
    all = all && ok;
  }
  return all;
}

export default { check };
