/*
 * Countersign console behaviour. No framework, no globals: load it after htmx.
 *
 *   <script src="{% static 'vendor/htmx/htmx.min.js' %}" defer></script>
 *   <script src="{% static 'console/app.js' %}" defer></script>
 *
 * 1. CSRF for htmx requests
 *    Django wants the token in the X-CSRFToken header on POST/PUT/PATCH/DELETE.
 *    Either of these in the base template is enough:
 *      a) <body hx-headers='{"X-CSRFToken": "{{ csrf_token }}"}'>   (house style; htmx itself
 *         sends it, inherited by every element under <body>)
 *      b) <meta name="csrf-token" content="{{ csrf_token }}">        (in <head>)
 *    On every unsafe htmx request that does not already carry the header, this script adds it,
 *    taking the token from (b), else from (a), else from the "csrftoken" cookie. Requests to
 *    another origin never get it.
 *
 * 2. Live countdowns
 *      <time class="countdown" data-countdown datetime="2025-01-31T12:00:00Z">12:00 UTC</time>
 *    The text becomes "4m 07s" / "1h 05m" / "2d 03h" and then "expired", refreshed every second.
 *    Elements swapped in later by htmx are picked up automatically. Options (attributes):
 *      data-countdown-soon="300"        seconds left below which .countdown--soon is added
 *      data-countdown-expired="expired" text shown once the time has passed
 *    Classes set: .countdown--soon, .countdown--expired. The server's text stays in title.
 *    Once, on expiry, the element fires a bubbling "countdown:expired" event, so an ancestor
 *    (say the table row) can refresh itself with hx-trigger="countdown:expired".
 *
 * 3. Bar widths
 *      <span class="bars__fill" data-bar-pct="42"></span>
 *    gets style.width = 42%, now and in every fragment htmx swaps in later. Through the CSSOM,
 *    because the Content-Security-Policy refuses style attributes in HTML.
 *
 * Nothing else is exposed.
 */
(function () {
  "use strict";

  var CSRF_HEADER = "X-CSRFToken";
  var SAFE_METHODS = /^(GET|HEAD|OPTIONS|TRACE)$/i;

  function tokenFromMeta() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta && meta.content ? meta.content : null;
  }

  function tokenFromBodyHeaders() {
    var raw = document.body && document.body.getAttribute("hx-headers");
    if (!raw) return null;
    try {
      var headers = JSON.parse(raw);
      return headers[CSRF_HEADER] || headers["X-CSRFTOKEN"] || headers["x-csrftoken"] || null;
    } catch (e) {
      return null; // "js:" expressions or malformed JSON: htmx handles those itself
    }
  }

  function tokenFromCookie() {
    var m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : null;
  }

  function hasHeader(headers, name) {
    var lower = name.toLowerCase();
    return Object.keys(headers).some(function (k) { return k.toLowerCase() === lower; });
  }

  function sameOrigin(path) {
    try {
      return new URL(path, window.location.href).origin === window.location.origin;
    } catch (e) {
      return false;
    }
  }

  document.addEventListener("htmx:configRequest", function (evt) {
    var d = evt.detail;
    if (SAFE_METHODS.test(d.verb || "GET")) return;
    if (!sameOrigin(d.path)) return;
    if (hasHeader(d.headers, CSRF_HEADER)) return;
    var token = tokenFromMeta() || tokenFromBodyHeaders() || tokenFromCookie();
    if (token) d.headers[CSRF_HEADER] = token;
  });

  /* ---------------------------------------------------------------- countdowns */

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function formatRemaining(seconds) {
    var d = Math.floor(seconds / 86400);
    var h = Math.floor((seconds % 86400) / 3600);
    var m = Math.floor((seconds % 3600) / 60);
    var s = seconds % 60;
    if (d > 0) return d + "d " + pad(h) + "h";
    if (h > 0) return h + "h " + pad(m) + "m";
    return m + "m " + pad(s) + "s";
  }

  function tick() {
    var now = Date.now();
    var nodes = document.querySelectorAll("time[data-countdown]");
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var at = Date.parse(el.getAttribute("datetime") || "");
      if (isNaN(at)) continue;
      if (!el.hasAttribute("data-countdown-init")) {
        el.setAttribute("data-countdown-init", "");
        el.classList.add("countdown");
        if (!el.title) el.title = el.textContent.trim() || new Date(at).toLocaleString();
      }
      var left = Math.floor((at - now) / 1000);
      var soon = parseInt(el.getAttribute("data-countdown-soon") || "300", 10);
      var expired = left <= 0;
      var text = expired
        ? (el.getAttribute("data-countdown-expired") || "expired")
        : formatRemaining(left);
      if (el.textContent !== text) el.textContent = text;
      el.classList.toggle("countdown--expired", expired);
      el.classList.toggle("countdown--soon", !expired && left <= soon);
      if (expired && !el.hasAttribute("data-countdown-fired")) {
        el.setAttribute("data-countdown-fired", "");
        el.dispatchEvent(new CustomEvent("countdown:expired", { bubbles: true }));
      }
    }
  }

  /* ---------------------------------------------------------------- bar widths */

  function bars() {
    var nodes = document.querySelectorAll("[data-bar-pct]");
    for (var i = 0; i < nodes.length; i++) {
      var pct = parseFloat(nodes[i].getAttribute("data-bar-pct"));
      nodes[i].style.width = (isFinite(pct) ? Math.min(Math.max(pct, 0), 100) : 0) + "%";
    }
  }

  function start() {
    bars();
    document.addEventListener("htmx:load", bars);
    document.addEventListener("htmx:oobAfterSwap", bars);
    tick();
    window.setInterval(tick, 1000);
    // a swap should not show the server's fallback text for up to a second
    document.addEventListener("htmx:afterSettle", tick);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
