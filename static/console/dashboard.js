// Dashboard charts with uPlot (vendored): operations created, confirmed and gone unknown.
(function () {
  function draw() {
    var holder = document.getElementById("ops-chart");
    var source = document.getElementById("ops-chart-data");
    if (!holder || !source || typeof uPlot === "undefined") return;
    var d = JSON.parse(source.textContent);
    var width = Math.max(280, holder.clientWidth || 600);
    var opts = {
      width: width, height: 220,
      series: [
        {},
        { label: "created", stroke: "#1d55c4", width: 2 },
        { label: "confirmed", stroke: "#17652f", width: 2 },
        { label: "unknown", stroke: "#a1191a", width: 2, dash: [6, 4] },
      ],
      axes: [{}, { label: "operations" }],
    };
    holder.innerHTML = "";
    new uPlot(opts, [d.x, d.created, d.confirmed, d.unknown], holder);
    holder.dataset.rendered = "true";
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
