// Dashboard charts with uPlot (vendored): operations over time, three indicators over time,
// and pass@k / pass^k by k over repeated trials.
(function () {
  "use strict";

  function data(id) {
    var source = document.getElementById(id);
    return source ? JSON.parse(source.textContent) : null;
  }

  function plot(holder, opts, columns) {
    opts.width = Math.max(280, holder.clientWidth || 600);
    opts.height = opts.height || 220;
    holder.innerHTML = "";
    new uPlot(opts, columns, holder);
    holder.dataset.rendered = "true";
  }

  var percent = { label: "rate", range: [0, 1], values: function (u, ticks) {
    return ticks.map(function (v) { return Math.round(v * 100) + "%"; });
  } };

  function draw() {
    if (typeof uPlot === "undefined") return;
    var d = data("ops-chart-data"), ops = document.getElementById("ops-chart");
    if (d && ops) {
      plot(ops, {
        series: [{}, { label: "created", stroke: "#1d55c4", width: 2 },
          { label: "confirmed", stroke: "#17652f", width: 2 },
          { label: "unknown", stroke: "#a1191a", width: 2, dash: [6, 4] }],
        axes: [{}, { label: "operations" }],
      }, [d.x, d.created, d.confirmed, d.unknown]);
    }
    var rates = document.getElementById("rates-chart");
    if (d && rates) {
      plot(rates, {
        scales: { y: { range: [0, 1] } },
        series: [{}, { label: "terminal success", stroke: "#17652f", width: 2, spanGaps: true, points: { show: true } },
          { label: "automatic recovery", stroke: "#1d55c4", width: 2, spanGaps: true, points: { show: true } },
          { label: "human intervention", stroke: "#9a5b00", width: 2, dash: [6, 4], spanGaps: true, points: { show: true } }],
        axes: [{}, percent],
      }, [d.x, d.success_rate, d.auto_recovery_rate, d.human_rate]);
    }
    var t = data("trials-chart-data"), trials = document.getElementById("trials-chart");
    if (t && trials && t.k.length) {
      plot(trials, {
        height: 180,
        scales: { x: { time: false }, y: { range: [0, 1] } },
        series: [{ label: "k" }, { label: "pass@k", stroke: "#17652f", width: 2, points: { show: true } },
          { label: "pass^k", stroke: "#a1191a", width: 2, points: { show: true } }],
        axes: [{ label: "k", values: function (u, ticks) { return ticks.map(function (v) { return v % 1 ? "" : v; }); } },
          percent],
      }, [t.k, t.pass_at_k, t.pass_hat_k]);
    }
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
