// k6/execution: the VU's number in the test (from 1).
import { currentVU } from './state.mjs';

export default {
  get vu() {
    return { idInTest: currentVU().id, iterationInScenario: 0 };
  },
};
