// A k6 soak test of the Hermes mobile gateway, with k6's own websockets
// module (k6 v1 or newer; for older k6 import from
// 'k6/experimental/websockets' instead).
//
// Every virtual user is one phone: it connects, says hello, waits for ready,
// sends a text every MESSAGE_EVERY seconds and times the demo agent's final
// answer ("You said: <text>") from the timestamp inside the text. After
// SESSION seconds it stops sending, waits ANSWER_WAIT seconds for the last
// answers, counts what is missing as lost, closes and starts over (a
// reconnection).
//
// A socket the gateway closes meanwhile (a drain's 1001 during a rolling
// update, or anything else) is reconnected at once, as the app does: the
// phone says hello again and sends its unanswered texts again under the
// same ids (the gateway handles each id once). hermes_reconnects counts
// these by close code; a close other than 1001 also counts as an error.
// An answer that comes twice (at least once, across a reconnection) counts
// in hermes_duplicates, not as an error.
//
//   MOBILE_TOKEN=… k6 run -e URL=ws://127.0.0.1:8787/ws -e VUS=500 -e DURATION=30m loadtest/k6/soak.js
//
// Settings (k6 -e NAME=value): URL, MOBILE_TOKEN (also read from the
// environment), VUS, DURATION, SESSION, MESSAGE_EVERY, ANSWER_WAIT,
// RECONNECT_DELAY, ANSWER_P99_MS (the answer-time threshold, 2000), RUN.
//
// Source addresses: from one address, the connections to one edge share
// that address's ephemeral ports (about 28,000 on Linux). k6's --local-ips
// spreads the virtual users over several (k6 hands each VU one of them, and
// k6/websockets dials through the VU's dialer, so its sockets use it); on
// loopback every 127.0.0.x is already there:
//
//   k6 run --local-ips=127.0.0.2-127.0.0.254 -e URL=ws://127.0.0.1:8787/ws -e VUS=50000 loadtest/k6/soak.js
//
// Away from loopback the addresses must be configured on the load
// generator's interface first (k6 binds them, it does not add them).

import { WebSocket } from 'k6/websockets';
import { check } from 'k6';
import exec from 'k6/execution';
import { Counter, Trend } from 'k6/metrics';
import { clearInterval, setInterval, setTimeout } from 'k6/timers';

const URL = __ENV.URL || 'ws://127.0.0.1:8787/ws';
const TOKEN = __ENV.MOBILE_TOKEN || '';
const VUS = parseInt(__ENV.VUS || '100', 10);
const DURATION = __ENV.DURATION || '10m';
const SESSION = parseFloat(__ENV.SESSION || '300'); // seconds one connection lives
const MESSAGE_EVERY = parseFloat(__ENV.MESSAGE_EVERY || '30'); // seconds between a phone's texts
const ANSWER_WAIT = parseFloat(__ENV.ANSWER_WAIT || '10'); // seconds an answer may take
const RECONNECT_DELAY = parseFloat(__ENV.RECONNECT_DELAY || '0.2'); // seconds before reconnecting, at most
const ANSWER_P99_MS = parseFloat(__ENV.ANSWER_P99_MS || '2000'); // threshold: 99% of answers within this
const RUN = __ENV.RUN || Math.random().toString(16).slice(2, 8);

const answerMs = new Trend('hermes_answer_ms', true);
const handshakeMs = new Trend('hermes_handshake_ms', true);
const sent = new Counter('hermes_sent');
const answered = new Counter('hermes_answered');
const lost = new Counter('hermes_lost');
const errors = new Counter('hermes_errors');
const reconnects = new Counter('hermes_reconnects');
const duplicates = new Counter('hermes_duplicates');

export const options = {
  scenarios: {
    soak: { executor: 'constant-vus', vus: VUS, duration: DURATION, gracefulStop: `${ANSWER_WAIT + 5}s` },
  },
  thresholds: {
    checks: ['rate==1.0'],
    hermes_lost: ['count==0'],
    hermes_errors: ['count==0'],
    hermes_answer_ms: [`p(99)<${ANSWER_P99_MS}`],
  },
};

export function setup() {
  if (!TOKEN) {
    throw new Error('set MOBILE_TOKEN (k6 run -e MOBILE_TOKEN=… or in the environment)');
  }
}

export default function () {
  const device = `k6-${RUN}-${exec.vu.idInTest}`;
  const prefix = `k6 ${device} `;
  const pending = new Map(); // seq -> the text sent
  let seq = 0;
  let ticker = null;
  let stopped = false; // no more texts this session
  let closing = false; // the session is over: a close is expected
  let ws = null;

  const stopTicker = () => {
    if (ticker !== null) {
      clearInterval(ticker);
      ticker = null;
    }
  };

  const send = () => {
    seq += 1;
    const now = Date.now();
    const frame = JSON.stringify({ t: 'text', id: `${device}-${seq}`, text: `${prefix}${seq} ${now}` });
    pending.set(seq, frame);
    ws.send(frame);
    sent.add(1);
  };

  const connect = () => {
    if (closing) {
      return; // a reconnection due after the session ended
    }
    const opened = Date.now();
    const sock = new WebSocket(URL);
    ws = sock;

    sock.onopen = () => {
      sock.send(JSON.stringify({
        t: 'hello',
        token: TOKEN,
        device: { id: device, name: `k6 ${device}`, platform: 'k6', app_version: '1' },
        user: { id: `k6-${RUN}`, name: 'k6' },
      }));
    };

    sock.onmessage = (event) => {
      let f;
      try {
        f = JSON.parse(event.data);
      } catch {
        errors.add(1, { kind: 'not_json' });
        return;
      }
      switch (f.t) {
        case 'ready':
          handshakeMs.add(Date.now() - opened);
          check(f, {
            'ready is protocol v1': (r) => r.v === 1,
            'ready names the session': (r) => r.session === `mobile:${device}`,
          });
          // After a reconnection: what is unanswered goes again, same ids.
          for (const frame of pending.values()) {
            sock.send(frame);
          }
          if (!stopped && ticker === null) {
            if (seq === 0) {
              send();
            }
            ticker = setInterval(send, MESSAGE_EVERY * 1000);
          }
          break;
        case 'message': {
          const answer = `You said: ${prefix}`;
          if (!f.final || typeof f.text !== 'string' || !f.text.startsWith(answer)) {
            break;
          }
          const [n, ts] = f.text.slice(answer.length).split(' ').map(Number);
          if (pending.delete(n)) {
            answered.add(1);
            answerMs.add(Date.now() - ts);
          } else if (n >= 1 && n <= seq) {
            duplicates.add(1); // answered before: at least once
          } else {
            errors.add(1, { kind: 'unexpected_answer' });
          }
          break;
        }
        case 'error':
          errors.add(1, { kind: `error:${f.code}` });
          break;
        default: // avatar, typing, pong: not timed
      }
    };

    sock.onerror = (e) => {
      if (!closing) {
        console.error(`${device}: ${e.error}`);
      }
    };

    sock.onclose = (event) => {
      if (ws !== sock) {
        return;
      }
      stopTicker();
      if (closing) {
        return;
      }
      // The gateway closed the socket: a drain (1001) or a fault. The app
      // reconnects; so does this phone, after a random pause that spreads
      // a drained edge's phones.
      reconnects.add(1, { code: String(event.code) });
      if (event.code !== 1001) {
        errors.add(1, { kind: 'unexpected_close' });
      }
      setTimeout(connect, Math.random() * RECONNECT_DELAY * 1000);
    };
  };

  connect();

  // Stop sending, give the last answers their time, then close.
  setTimeout(() => {
    stopped = true;
    stopTicker();
    setTimeout(() => {
      check(pending, { 'every text answered': (p) => p.size === 0 });
      lost.add(pending.size);
      closing = true;
      ws.close();
    }, ANSWER_WAIT * 1000);
  }, Math.max(1, SESSION - ANSWER_WAIT) * 1000);
}
