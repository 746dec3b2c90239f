// Live views: after every (re)connect, tell the server the last event this page has seen,
// so it sends what was missed. htmx's ws extension reconnects but does not replay.
(function () {
  function cursor() {
    var el = document.getElementById("live-cursor");
    return el ? parseInt(el.dataset.lastEventId || "0", 10) : 0;
  }
  function indicator(state) {
    var el = document.getElementById("live-indicator");
    if (!el) return;
    el.dataset.state = state;
    var text = el.querySelector(".live__text");
    if (text) text.textContent = state === "connected" ? "live" : state;
  }
  document.addEventListener("htmx:wsOpen", function (evt) {
    evt.detail.socketWrapper.send(JSON.stringify({ last_event_id: cursor() }));
    indicator("connected");
  });
  document.addEventListener("htmx:wsClose", function () { indicator("disconnected"); });
  document.addEventListener("htmx:wsError", function () { indicator("disconnected"); });
  document.addEventListener("DOMContentLoaded", function () {
    if (!document.querySelector("[ws-connect]")) indicator("idle");
  });
})();
