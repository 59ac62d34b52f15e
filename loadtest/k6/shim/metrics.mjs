// k6/metrics: Counter, Trend, Rate and Gauge with add(value, tags).
import { record } from './state.mjs';

class Metric {
  constructor(name, type) {
    this.name = name;
    this.type = type;
  }

  add(value, tags) {
    record(this.name, this.type, Number(value), tags);
  }
}

export class Counter extends Metric {
  constructor(name) {
    super(name, 'counter');
  }
}

export class Trend extends Metric {
  constructor(name) {
    super(name, 'trend');
  }
}

export class Rate extends Metric {
  constructor(name) {
    super(name, 'rate');
  }
}

export class Gauge extends Metric {
  constructor(name) {
    super(name, 'gauge');
  }
}
