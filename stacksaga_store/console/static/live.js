// The live page: one EventSource on /api/live/stream; each "live" event updates the counters
// in place and redraws three small SVG line charts. No library, nothing fetched from elsewhere.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  function set(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = String(value); }
  }
  function chart(id, values) {
    var svg = document.getElementById(id);
    if (!svg) { return; }
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var w = 300, h = 80, max = 1;
    values.forEach(function (v) { if (v > max) { max = v; } });
    var points = values.map(function (v, i) {
      var x = values.length > 1 ? (i / (values.length - 1)) * (w - 4) + 2 : w / 2;
      var y = h - 4 - (v / max) * (h - 18);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    var line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("class", "chart-line");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#1565c0");
    line.setAttribute("stroke-width", "2");
    svg.appendChild(line);
    var label = document.createElementNS(NS, "text");
    label.setAttribute("x", "4");
    label.setAttribute("y", "12");
    label.setAttribute("class", "chart-label");
    label.textContent = "max " + max;
    svg.appendChild(label);
  }
  function update(data) {
    set("live-updated", data.taken_at);
    set("live-starts-per-second", data.starts_per_second);
    set("live-starts", data.totals.starts);
    set("live-completions", data.totals.completions);
    set("live-retries", data.totals.retries);
    set("live-restores", data.totals.restores);
    set("live-frozen", data.frozen);
    set("live-running", data.counts.IN_PROGRESS + data.counts.STARTED + data.counts.COMPENSATING);
    var samples = data.samples || [];
    chart("chart-starts", samples.map(function (s) { return s.starts; }));
    chart("chart-completions", samples.map(function (s) { return s.completions; }));
    chart("chart-frozen", samples.map(function (s) { return s.frozen_now; }));
  }
  var source = new EventSource("/api/live/stream");
  source.addEventListener("live", function (event) {
    set("live-status", "connected");
    update(JSON.parse(event.data));
  });
  source.onerror = function () { set("live-status", "reconnecting"); };
})();
