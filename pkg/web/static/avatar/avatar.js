// The avatar follows the embedding app: window.postMessage({t: "avatar",
// state}) (an object or its JSON text) or the fragment #state=<state>.
// Unknown states count as idle, as the gateway does. No network requests.
(function () {
  "use strict";
  var STATES = ["idle", "thinking", "speaking"];
  var root = document.documentElement;
  var main = document.querySelector(".avatar");
  var label = document.querySelector(".label");

  function set(state) {
    if (STATES.indexOf(state) < 0) state = "idle";
    root.dataset.state = state;
    label.textContent = state;
    main.setAttribute("aria-label", "Agent is " + state);
  }

  function fromHash() {
    var m = /(?:^|[#&])state=([a-z]+)/.exec(location.hash);
    if (m) set(m[1]);
  }

  window.addEventListener("message", function (e) {
    var d = e.data;
    if (typeof d === "string") {
      try { d = JSON.parse(d); } catch (err) { return; }
    }
    if (d && typeof d === "object" && d.t === "avatar") set(String(d.state));
  });
  window.addEventListener("hashchange", fromHash);
  fromHash();
})();
