// Cosigner approver pages: tick every "time left" (<time data-seconds-left>) once a second.
// The server renders the same text, so the pages are right without JavaScript; this file is
// served from /ui/static (CSP script-src 'self', no inline script). The deadline is taken
// from the server's own count of seconds left, so a wrong clock on this device does not
// move it.
(function () {
  "use strict";
  var loaded = Date.now();
  var timers = Array.prototype.slice.call(document.querySelectorAll("time[data-seconds-left]"));
  if (!timers.length) { return; }
  timers.forEach(function (el) {
    el.cosignerDeadline = loaded + 1000 * parseInt(el.getAttribute("data-seconds-left"), 10);
  });

  function text(seconds) {
    if (seconds <= 0) { return "expired"; }
    if (seconds < 60) { return seconds + " s left"; }
    if (seconds < 3600) {
      var s = seconds % 60;
      return Math.floor(seconds / 60) + " min " + (s < 10 ? "0" : "") + s + " s left";
    }
    if (seconds < 86400) {
      return Math.floor(seconds / 3600) + " h " + Math.floor(seconds % 3600 / 60) + " min left";
    }
    return Math.floor(seconds / 86400) + " d " + Math.floor(seconds % 86400 / 3600) + " h left";
  }

  function tick() {
    var now = Date.now();
    timers.forEach(function (el) {
      var left = Math.max(0, Math.ceil((el.cosignerDeadline - now) / 1000));
      var shown = text(left);
      if (el.textContent !== shown) { el.textContent = shown; }
      if (left <= 0 && !el.classList.contains("expired")) {
        el.classList.add("expired");
        el.setAttribute("title", "Reload the page: this request can no longer be approved.");
      }
    });
  }

  tick();
  window.setInterval(tick, 1000);
})();
