// Draws the charts of the cost pages with uPlot (served from our static files, no CDN).
// Each <div data-chart="ID"> names a <script type="application/json" id="ID"> holding
// {title, xlabel, ylabel, kind: "line"|"bars", x, series: [{label, values}]} or, for series
// with x values of their own, {tables: [[xs, ys], ...], labels: [...]}.
(function () {
  "use strict";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"];

  function draw(box) {
    var spec = JSON.parse(document.getElementById(box.dataset.chart).textContent);
    var bars = spec.kind === "bars";
    var data, labels;
    if (spec.tables) {
      data = uPlot.join(spec.tables);
      labels = spec.labels;
    } else {
      data = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
      labels = spec.series.map(function (s) { return s.label; });
    }
    var xAxis = { label: spec.xlabel };
    if (spec.xticks) {
      xAxis.values = function (u, vals) { return vals.map(function (v) { return spec.xticks[v] || ""; }); };
      xAxis.splits = function () { return spec.x; };
    }
    var series = [{ label: spec.xlabel }].concat(labels.map(function (label, i) {
      var color = COLORS[i % COLORS.length];
      var one = { label: label, stroke: color, width: 2, spanGaps: true };
      if (bars) {
        one.fill = color + "88";
        one.paths = uPlot.paths.bars({ size: [0.6 / labels.length, 60], align: 0 });
        one.points = { show: false };
      } else if (spec.steps) {
        one.paths = uPlot.paths.stepped({ align: 1 });
      }
      return one;
    }));
    var opts = {
      title: spec.title, width: width(box), height: 280,
      scales: { x: { time: false } }, axes: [xAxis, { label: spec.ylabel }], series: series,
    };
    var plot = new uPlot(opts, data, box);
    box.dataset.rendered = "true";
    // The chart follows its box: a phone turned, a window resized (never wider than the page).
    if (window.ResizeObserver) {
      new ResizeObserver(function () {
        if (width(box) !== plot.width) { plot.setSize({ width: width(box), height: 280 }); }
      }).observe(box);
    }
  }

  function width(box) { return Math.max(200, Math.floor(box.clientWidth || 720)); }

  document.querySelectorAll("[data-chart]").forEach(draw);
})();
