// The run page's span waterfall, drawn here from compact rows (runs/waterfall.py `payload`):
// tree and time axis, errors and the critical path marked, large subtrees collapsed until
// opened. While the run is active it asks every few seconds for the spans it has not seen and
// appends them; nothing is re-sent or re-drawn from scratch when nothing arrived.
(function () {
  "use strict";

  // Positions in a row, as runs/waterfall.py `payload` writes them.
  var ID = 0, SPAN = 1, PARENT = 2, NAME = 3, START = 4, DUR = 5, ERR = 6, MODEL = 7, STEP = 8,
    IN = 9, OUT = 10, COST = 11;
  var COLLAPSE_OVER = 25; // below the root, a subtree of more spans than this starts closed
  var POLL_MS = 3000;

  function esc(text) {
    return String(text == null ? "" : text).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function fmt(ms) {
    return ms.toLocaleString("en", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
  }

  function Waterfall(root, rows) {
    this.root = root;
    this.list = root.querySelector("[data-rows]");
    this.meta = root.querySelector("#run-waterfall-meta");
    this.url = root.dataset.traceUrl;
    this.cursor = parseInt(root.dataset.cursor, 10) || 0;
    this.limit = parseInt(root.dataset.limit, 10) || 5000;
    this.active = root.dataset.active === "true";
    this.rows = [];
    this.known = new Set();
    this.opened = new Map(); // span id -> true/false, once a person toggled it
    this.add(rows);
    this.draw();
    var self = this;
    this.list.addEventListener("click", function (event) {
      var button = event.target.closest("button[data-span]");
      if (!button) return;
      var span = button.dataset.span;
      self.opened.set(span, button.getAttribute("aria-expanded") !== "true");
      self.draw();
      var again = self.list.querySelector('button[data-span="' + CSS.escape(span) + '"]');
      if (again) again.focus();
    });
    if (this.active) this.schedule(POLL_MS);
  }

  Waterfall.prototype.add = function (rows) {
    for (var i = 0; i < rows.length; i++) {
      if (this.known.has(rows[i][SPAN])) continue;
      this.known.add(rows[i][SPAN]);
      this.rows.push(rows[i]);
    }
  };

  // Tree order (children by start time), depth, subtree size and errors, and the critical path:
  // from the root that ends last, repeatedly the child that ends last.
  Waterfall.prototype.layout = function () {
    var rows = this.rows, bySpan = new Map(), kids = new Map(), roots = [];
    rows.sort(function (a, b) { return a[START] - b[START] || (a[SPAN] < b[SPAN] ? -1 : 1); });
    rows.forEach(function (r) { bySpan.set(r[SPAN], r); });
    rows.forEach(function (r) {
      var p = r[PARENT];
      if (p && p !== r[SPAN] && bySpan.has(p)) {
        if (!kids.has(p)) kids.set(p, []);
        kids.get(p).push(r);
      } else {
        roots.push(r); // a root, or an orphan whose parent never arrived
      }
    });
    var order = [], depth = new Map(), seen = new Set(), stack = [];
    for (var i = roots.length - 1; i >= 0; i--) stack.push([roots[i], 0]);
    while (stack.length) { // iterative: deep traces must not hit the recursion limit
      var item = stack.pop(), r = item[0];
      if (seen.has(r[SPAN])) continue;
      seen.add(r[SPAN]);
      depth.set(r[SPAN], item[1]);
      order.push(r);
      var children = kids.get(r[SPAN]) || [];
      for (var j = children.length - 1; j >= 0; j--) stack.push([children[j], item[1] + 1]);
    }
    var size = new Map(), errors = new Map();
    for (var k = order.length - 1; k >= 0; k--) {
      var row = order[k], s = 0, e = 0;
      (kids.get(row[SPAN]) || []).forEach(function (c) { s += 1 + size.get(c[SPAN]); e += c[ERR] + errors.get(c[SPAN]); });
      size.set(row[SPAN], s);
      errors.set(row[SPAN], e);
    }
    var critical = new Set(), criticalMs = 0, t0 = Infinity, t1 = -Infinity;
    rows.forEach(function (r) { t0 = Math.min(t0, r[START]); t1 = Math.max(t1, r[START] + r[DUR]); });
    var end = function (r) { return r[START] + r[DUR]; };
    var latest = function (list) { return list.reduce(function (a, b) { return end(b) > end(a) ? b : a; }); };
    if (roots.length) {
      var current = latest(roots);
      criticalMs = current[DUR];
      while (current) {
        critical.add(current[SPAN]);
        var next = kids.get(current[SPAN]);
        current = next && next.length ? latest(next) : null;
      }
    }
    return { order: order, depth: depth, kids: kids, size: size, errors: errors, critical: critical,
      criticalMs: criticalMs, t0: t0, total: Math.max(t1 - t0, 0.001) };
  };

  Waterfall.prototype.isOpen = function (tree, row) {
    var id = row[SPAN];
    if (this.opened.has(id)) return this.opened.get(id);
    var parent = row[PARENT], siblings = parent && tree.kids.get(parent);
    return tree.depth.get(id) === 0 || tree.size.get(id) <= COLLAPSE_OVER || (siblings && siblings.length === 1);
  };

  Waterfall.prototype.draw = function () {
    if (!this.rows.length) return;
    var tree = this.layout(), html = [], hideBelow = Infinity, shown = 0;
    for (var i = 0; i < tree.order.length; i++) {
      var r = tree.order[i], id = r[SPAN], depth = tree.depth.get(id);
      if (depth > hideBelow) continue; // inside a closed subtree
      hideBelow = Infinity;
      var hasKids = tree.size.get(id) > 0, open = hasKids && this.isOpen(tree, r);
      if (hasKids && !open) hideBelow = depth;
      shown++;
      var offset = (r[START] - tree.t0) / tree.total * 100;
      var width = Math.min(Math.max(r[DUR] / tree.total * 100, 0.2), 100 - offset);
      var classes = "waterfall__row" + (tree.critical.has(id) ? " is-critical" : "") + (r[ERR] ? " is-error" : "");
      var detail = fmt(r[DUR]) + " ms";
      if (r[IN] != null || r[OUT] != null) detail += " · " + (r[IN] || 0) + " in / " + (r[OUT] || 0) + " out tokens";
      if (r[COST]) detail += " · " + r[COST];
      if (r[STEP]) detail += " · step " + r[STEP];
      var toggle = hasKids
        ? '<button type="button" class="waterfall__toggle" data-span="' + esc(id) + '" aria-expanded="' + open +
          '" aria-label="' + (open ? "Collapse " : "Expand ") + tree.size.get(id) + " spans under " + esc(r[NAME]) +
          '">' + (open ? "▾" : "▸") + "</button>"
        : '<span class="waterfall__toggle" aria-hidden="true"></span>';
      var hidden = hasKids && !open
        ? ' <span class="muted small">+' + tree.size.get(id) + "</span>" +
          (tree.errors.get(id) ? ' <span class="badge badge--failed">' + tree.errors.get(id) + " ⚠</span>" : "")
        : "";
      html.push(
        '<div class="' + classes + '" role="treeitem" aria-level="' + (depth + 1) + '"' +
        (hasKids ? ' aria-expanded="' + open + '"' : "") + ' data-span="' + esc(id) + '">' +
        '<div class="waterfall__name" data-depth="' + depth + '" title="' + esc(r[NAME]) + '">' + toggle +
        esc(r[NAME]) + (r[MODEL] ? ' <span class="muted small">' + esc(r[MODEL]) + "</span>" : "") + hidden + "</div>" +
        '<div class="waterfall__track"><span class="waterfall__bar" data-left="' + offset.toFixed(3) +
        '" data-width="' + width.toFixed(3) + '" title="' + esc(detail) + '"></span></div>' +
        '<div class="waterfall__ms num">' + fmt(r[DUR]) + "</div></div>");
    }
    this.list.innerHTML = html.join("");
    // Positions through the CSSOM: the Content-Security-Policy refuses style attributes in HTML.
    var names = this.list.querySelectorAll(".waterfall__name[data-depth]");
    for (var n = 0; n < names.length; n++) names[n].style.paddingLeft = names[n].dataset.depth + "rem";
    var bars = this.list.querySelectorAll(".waterfall__bar[data-left]");
    for (var b = 0; b < bars.length; b++) {
      bars[b].style.left = bars[b].dataset.left + "%";
      bars[b].style.width = bars[b].dataset.width + "%";
    }
    this.root.dataset.rendered = String(this.rows.length);
    this.meta.textContent = this.rows.length + " spans, " + shown + " shown · critical path " +
      fmt(tree.criticalMs) + " ms" + (this.rows.length >= this.limit ? " · only the first " + this.limit + " spans" : "");
  };

  Waterfall.prototype.schedule = function (ms) {
    var self = this;
    window.setTimeout(function () { self.poll(); }, ms);
  };

  Waterfall.prototype.poll = function () {
    var self = this;
    if (document.hidden) return this.schedule(POLL_MS); // no work for a tab nobody looks at
    var url = this.url + "?after=" + this.cursor + "&known=" + this.rows.length;
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (response.status === 204) return null;
        if (!response.ok) throw new Error("trace poll answered " + response.status);
        return response.json();
      })
      .then(function (data) {
        var again = POLL_MS;
        if (data) {
          self.add(data.spans);
          self.cursor = data.cursor;
          self.active = data.active;
          var summary = document.getElementById("run-trace-summary");
          if (summary) summary.outerHTML = data.summary;
          if (data.spans.length) self.draw();
          // A span committed out of id order slipped below the cursor: fetch everything once.
          if (self.rows.length < Math.min(data.total, self.limit)) { self.cursor = 0; again = 0; }
        }
        if (self.active) self.schedule(again);
      })
      .catch(function () { self.schedule(POLL_MS); });
  };

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("run-waterfall"), data = document.getElementById("run-spans");
    if (root && data) root.waterfall = new Waterfall(root, JSON.parse(data.textContent));
  });
})();
