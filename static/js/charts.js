/* The site's charts, drawn with the vendored uPlot (static/vendor/uplot/) from the specs the
   pages put in <script type="application/json"> (training/charts.py: chart_spec). Axes with
   their labels, a line per series (dashed: held-out measurements), the hovered values in
   the legend under the chart, dashed markers (checkpoints, version changes) and an optional
   band (mean ± std). Each chart takes the width of its box and follows it when the window
   or the page changes. A chart's figure is kept across htmx swaps (hx-preserve) while its
   spec, outside it, is swapped: a live page's charts take the new data in place, without
   flicker and without losing the hovered point. */
(function () {
  "use strict";

  var PALETTE = ["#3056d3", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#1098ad", "#e67700", "#5c940d"];
  var DAY = 86400;
  var charts = [];

  function number(v) {
    if (v == null || !isFinite(v)) return "—";
    var a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 100000 || a < 0.001) return v.toExponential(2);
    if (a >= 100) return String(Math.round(v));
    return String(Number(v.toPrecision(3)));
  }

  function formatter(kind) {
    if (kind === "percent") {
      return function (v) { return v == null ? "—" : Math.round(v * 100) + "%"; };
    }
    if (kind === "int") {
      return function (v) { return v == null ? "—" : String(Math.round(v)); };
    }
    return number;
  }

  function duration(s) {
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return (s / 3600).toFixed(1) + " h";
  }

  function day(ts) {
    return new Date(ts * 1000).toISOString().slice(0, 10);
  }

  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

  function dayLabel(ts) {
    var d = new Date(ts * 1000);
    return MONTHS[d.getUTCMonth()] + " " + d.getUTCDate();
  }

  /* A day axis steps by whole days (a point is a day: no "12pm" between them), as many as
     fit with room for each label. */
  var DAY_STEPS = [1, 2, 3, 7, 14, 28, 56, 91, 182, 364].map(function (n) { return n * DAY; });
  /* Steps and episodes are counted: their axis steps by whole numbers. */
  var WHOLE_STEPS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

  function xValue(spec) {
    var x = spec.x;
    return function (u, v) {
      if (v == null) return "—";
      if (x.kind === "day") return day(v);
      if (x.kind === "step") {
        var seconds = (x.elapsed || {})[String(v)];
        return v + (seconds != null ? " · " + duration(seconds) + " in" : "");
      }
      return number(v);
    };
  }

  /* uPlot wants one x array and, per series, a value (or null) at each x. */
  function aligned(spec) {
    var seen = {};
    var xs = [];
    spec.series.forEach(function (s) {
      s.points.forEach(function (p) {
        if (!(p[0] in seen)) { seen[p[0]] = true; xs.push(p[0]); }
      });
    });
    xs.sort(function (a, b) { return a - b; });
    var at = {};
    xs.forEach(function (x, i) { at[x] = i; });
    var data = [xs];
    spec.series.forEach(function (s) {
      var ys = xs.map(function () { return null; });
      s.points.forEach(function (p) { ys[at[p[0]]] = p[1]; });
      data.push(ys);
    });
    return data;
  }

  /* Drawn on the plot's canvas: each series' band under its line, and the markers. `entry`
     holds the current spec (a live page replaces it). */
  function overlays(entry, colors) {
    return {
      hooks: {
        drawSeries: [function (u, i) {
          var spec = entry.spec;
          var band = spec.series[i - 1] && spec.series[i - 1].band;
          if (!band || !band.length || !u.series[i].show) return;
          var ctx = u.ctx;
          ctx.save();
          ctx.beginPath();
          band.forEach(function (b, k) {
            var x = u.valToPos(b[0], "x", true), y = u.valToPos(b[2], "y", true);
            if (k === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
          });
          band.slice().reverse().forEach(function (b) {
            ctx.lineTo(u.valToPos(b[0], "x", true), u.valToPos(b[1], "y", true));
          });
          ctx.closePath();
          ctx.globalAlpha = 0.15;
          ctx.fillStyle = colors[i - 1];
          ctx.fill();
          ctx.restore();
        }],
        draw: [function (u) {
          var markers = entry.spec.markers || [];
          if (!markers.length) return;
          var ctx = u.ctx, px = uPlot.pxRatio, box = u.bbox;
          ctx.save();
          ctx.strokeStyle = "#868e96";
          ctx.fillStyle = "#475467";
          ctx.lineWidth = px;
          ctx.setLineDash([4 * px, 4 * px]);
          ctx.font = Math.round(11 * px) + "px system-ui, sans-serif";
          var lastLabelEnd = -Infinity, row = 0;
          markers.forEach(function (m) {
            // On a pixel's middle, so a thin line is one crisp column, not two faint ones.
            var x = Math.round(u.valToPos(m.x, "x", true)) + 0.5;
            if (x < box.left - 1 || x > box.left + box.width + 1) return;
            ctx.beginPath();
            ctx.moveTo(x, box.top);
            ctx.lineTo(x, box.top + box.height);
            ctx.stroke();
            // Labels of nearby markers go on the next row rather than over each other, and
            // those right of the middle sit left of their line.
            var width = ctx.measureText(m.label).width;
            var right = x > box.left + box.width / 2;
            var start = right ? x - 3 * px - width : x + 3 * px;
            row = start < lastLabelEnd + 4 * px ? (row + 1) % 3 : 0;
            lastLabelEnd = start + width;
            ctx.textAlign = "left";
            ctx.fillText(m.label, start, box.top + (12 + 12 * row) * px);
          });
          ctx.restore();
        }],
      },
    };
  }

  function xRange(entry) {
    if (!entry.spec.x.range) return undefined;
    return function () { return entry.spec.x.range.slice(0, 2); };
  }

  function options(entry, width) {
    var spec = entry.spec;
    var y = formatter(spec.y.format);
    var bars = spec.kind === "bars";
    var colors = spec.series.map(function (s, i) { return PALETTE[i % PALETTE.length]; });
    var series = [{ label: spec.x.label || "x", value: xValue(spec) }];
    spec.series.forEach(function (s, i) {
      var few = s.points.length <= 60;
      series.push({
        label: s.label,
        stroke: colors[i],
        width: 2,
        dash: s.dash ? [6, 4] : undefined,
        spanGaps: true,
        fill: bars ? colors[i] + "66" : undefined,
        paths: bars ? uPlot.paths.bars({ size: [0.7, 40] }) : undefined,
        points: { show: bars ? false : few, size: 6, fill: colors[i] },
        value: function (u, v) { return y(v); },
      });
    });
    var yRange = spec.y.range;
    return {
      width: width,
      height: spec.height || 220,
      series: series,
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); },
      scales: {
        x: { time: spec.x.kind === "day", range: xRange(entry) },
        y: yRange ? { range: function () { return [yRange[0], yRange[1]]; } } : { auto: true },
      },
      axes: [
        {
          label: spec.x.label || null,
          labelSize: 18,
          space: spec.x.kind === "day" ? 70 : 50,
          stroke: "#475467",
          grid: { stroke: "#eaecf0" },
          incrs: spec.x.kind === "day" ? DAY_STEPS : WHOLE_STEPS,
          values: function (u, ticks) { return ticks.map(spec.x.kind === "day" ? dayLabel : number); },
        },
        {
          label: spec.y.label || null,
          labelSize: 18,
          size: 52,
          stroke: "#475467",
          grid: { stroke: "#eaecf0" },
          values: function (u, ticks) { return ticks.map(y); },
        },
      ],
      legend: { live: true },
      cursor: { drag: { x: false, y: false }, points: { size: 8 } },
      plugins: [overlays(entry, colors)],
    };
  }

  function hasData(spec) {
    return spec.series.some(function (s) { return s.points.length; });
  }

  function draw(figure) {
    var source = document.getElementById(figure.getAttribute("data-chart"));
    var holder = figure.querySelector(".uchart-plot");
    if (!source || !holder || typeof uPlot === "undefined") return;
    var entry = { figure: figure, holder: holder, text: source.textContent, spec: JSON.parse(source.textContent) };
    figure.setAttribute("data-drawn", "");
    charts.push(entry);
    if (!hasData(entry.spec)) {
      figure.classList.add("uchart-empty");
      return;
    }
    figure.classList.remove("uchart-empty");
    holder.style.minHeight = "";
    entry.chart = new uPlot(options(entry, Math.max(160, holder.clientWidth)), aligned(entry.spec), holder);
    figure.uplot = entry.chart; // for the browser tests, which read positions off the plot
    figure.classList.add("uchart-drawn");
  }

  /* A kept figure whose spec was swapped: new data in place, or drawn again when its lines
     changed (a validation line appeared). */
  function refresh(entry) {
    var source = document.getElementById(entry.figure.getAttribute("data-chart"));
    if (!source || source.textContent === entry.text) return;
    var spec = JSON.parse(source.textContent);
    entry.text = source.textContent;
    var summary = entry.figure.querySelector(".uchart-summary");
    if (summary) summary.textContent = spec.summary;
    var same = entry.chart && spec.series.length === entry.spec.series.length && hasData(spec);
    entry.spec = spec;
    if (same) {
      entry.chart.setData(aligned(spec));
      return;
    }
    if (entry.chart) { entry.chart.destroy(); entry.chart = null; }
    charts.splice(charts.indexOf(entry), 1);
    entry.figure.removeAttribute("data-drawn");
    draw(entry.figure);
  }

  function drawAll(root) {
    var figures = (root.querySelectorAll ? root : document).querySelectorAll("figure.uchart:not([data-drawn])");
    Array.prototype.forEach.call(figures, draw);
  }

  function resize() {
    charts = charts.filter(function (c) {
      if (!c.figure.isConnected) {
        if (c.chart) c.chart.destroy();
        return false;
      }
      if (!c.chart) return true;
      var width = Math.max(160, c.holder.clientWidth);
      if (Math.abs(width - c.chart.width) > 1) c.chart.setSize({ width: width, height: c.spec.height || 220 });
      return true;
    });
  }

  var pending = null;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(resize, 100);
  });
  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  document.addEventListener("htmx:afterSettle", function (event) {
    resize();
    charts.slice().forEach(refresh);
    drawAll(event.target);
  });
})();
