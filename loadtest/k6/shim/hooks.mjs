// Module resolution hooks: the k6 modules a script imports resolve to the
// shim's files (node:module register, see run.mjs).
const shims = {
  k6: 'k6.mjs',
  'k6/execution': 'execution.mjs',
  'k6/metrics': 'metrics.mjs',
  'k6/timers': 'timers.mjs',
  'k6/websockets': 'websockets.mjs',
  'k6/experimental/websockets': 'websockets.mjs',
};

export async function resolve(specifier, context, next) {
  if (Object.hasOwn(shims, specifier)) {
    return { url: new URL(shims[specifier], import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
