// k6/websockets: the WHATWG WebSocket as k6 v1 exposes it (onopen,
// onmessage with event.data, onerror with event.error, onclose with
// event.code), on Node's WebSocket (node --experimental-websocket). An
// open or opening socket keeps its VU's iteration alive.
import { currentVU, withVU } from './state.mjs';

export class WebSocket {
  constructor(url, protocols) {
    const vu = currentVU();
    vu.hold();
    let alive = true;
    const ws = new globalThis.WebSocket(url, protocols);
    this.ws = ws;
    this.onopen = null;
    this.onmessage = null;
    this.onerror = null;
    this.onclose = null;
    const call = (name, event) => {
      if (typeof this[name] === 'function') {
        withVU(vu, this[name], event);
      }
    };
    ws.onopen = () => call('onopen', { type: 'open' });
    ws.onmessage = (e) => call('onmessage', { type: 'message', data: e.data });
    ws.onerror = (e) => call('onerror', { type: 'error', error: e.message || 'websocket error' });
    ws.onclose = (e) => {
      if (alive) {
        alive = false;
        vu.release();
      }
      if (typeof this.onclose === 'function') {
        withVU(vu, this.onclose, { type: 'close', code: e.code, reason: e.reason });
      } else {
        vu.settle();
      }
    };
  }

  get readyState() {
    return this.ws.readyState;
  }

  send(data) {
    this.ws.send(data);
  }

  close(code, reason) {
    this.ws.close(code, reason);
  }
}
