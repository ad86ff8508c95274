"use strict";
(function () {
  var POLL_MS = __POLL_MS__, MAX_POINTS = __POINTS__, STALE_MS = 3000;
  var SVG = "http://www.w3.org/2000/svg";
  var STATES = ["healthy", "degraded", "unhealthy", "starting", "draining"];
  var OUTCOMES = ["fast", "slow", "overloaded", "timeout", "fatal", "error"];
  var ENVOY = ["HEALTHY", "UNHEALTHY", "DRAINING"];
  var COLUMNS = ["Endpoint", "State", "Envoy", "Last probe", "TTFT (last " + MAX_POINTS +
    ")", "Reason", "Overrides"];
  // Read by tests and handy in a console: polls done, failed polls, last good poll.
  var page = window.llmHealthStatusPage = {polls: 0, errors: 0, lastOk: 0};
  var clusters = new Map();   // cluster name -> {section, tbody, meta, rows: Map}
  var history = new Map();    // "cluster|address" -> {at, points: [{ttft, outcome}]}
  var $ = function (id) { return document.getElementById(id); };

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function known(value, list) { return list.indexOf(value) >= 0 ? value : "other"; }
  function badge(text, kind) { return el("span", "badge b-" + kind, text); }
  function fill(node, children) {
    while (node.firstChild) { node.removeChild(node.firstChild); }
    children.forEach(function (child) { if (child) { node.appendChild(child); } });
  }
  function ms(value) {
    if (typeof value !== "number") { return "-"; }
    return value >= 1000 ? (value / 1000).toFixed(2) + " s" : Math.round(value) + " ms";
  }
  function ago(epoch) {
    if (typeof epoch !== "number") { return ""; }
    var s = Math.max(0, Date.now() / 1000 - epoch);
    if (s < 90) { return Math.round(s) + " s"; }
    if (s < 5400) { return Math.round(s / 60) + " min"; }
    return (s / 3600).toFixed(1) + " h";
  }

  function cluster(name) {
    var c = clusters.get(name);
    if (c) { return c; }
    var section = el("section", "cluster");
    var head = el("div", "chead");
    head.appendChild(el("h2", "", name));
    var meta = el("span", "muted small");
    head.appendChild(meta);
    section.appendChild(head);
    var table = el("table"), thead = el("thead"), tr = el("tr");
    COLUMNS.forEach(function (title) { tr.appendChild(el("th", "", title)); });
    thead.appendChild(tr);
    table.appendChild(thead);
    var tbody = el("tbody");
    table.appendChild(tbody);
    section.appendChild(table);
    c = {section: section, tbody: tbody, meta: meta, rows: new Map()};
    clusters.set(name, c);
    return c;
  }

  function row(c, address) {
    var r = c.rows.get(address);
    if (r) { return r; }
    var tr = el("tr", "ep"), cells = {};
    COLUMNS.forEach(function (title, i) {
      var td = el("td");
      td.setAttribute("data-label", title.split(" (")[0]);
      var box = el("div");
      td.appendChild(box);
      tr.appendChild(td);
      cells[i] = box;
    });
    r = {tr: tr, cells: cells};
    c.rows.set(address, r);
    return r;
  }

  function remember(key, probe) {
    var h = history.get(key);
    if (!h) { h = {at: null, points: []}; history.set(key, h); }
    if (probe && probe.at && probe.at !== h.at) {
      h.at = probe.at;
      h.points.push({ttft: typeof probe.ttft_ms === "number" ? probe.ttft_ms : null,
        outcome: String(probe.outcome)});
      if (h.points.length > MAX_POINTS) { h.points.splice(0, h.points.length - MAX_POINTS); }
    }
    return h.points;
  }

  function spark(points) {
    var W = 130, H = 30, pad = 3, svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("role", "img");
    var values = points.map(function (p) { return p.ttft; })
      .filter(function (v) { return v !== null; });
    var max = Math.max.apply(null, values.concat([1])) * 1.1;
    var x = function (i) { return pad + i * (W - 2 * pad) / Math.max(1, MAX_POINTS - 1); };
    var y = function (v) { return H - pad - v / max * (H - 2 * pad); };
    var coords = [], last = null;
    points.forEach(function (p, i) {
      if (p.ttft === null) {  // no first token: a red tick on the baseline
        var tick = document.createElementNS(SVG, "line");
        tick.setAttribute("class", "fail");
        tick.setAttribute("x1", x(i)); tick.setAttribute("x2", x(i));
        tick.setAttribute("y1", H - pad); tick.setAttribute("y2", H - pad - 8);
        svg.appendChild(tick);
      } else {
        coords.push(x(i).toFixed(1) + "," + y(p.ttft).toFixed(1));
        last = [x(i), y(p.ttft)];
      }
    });
    var line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", coords.join(" "));
    svg.appendChild(line);
    if (last) {
      var dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("class", "last");
      dot.setAttribute("cx", last[0]); dot.setAttribute("cy", last[1]);
      dot.setAttribute("r", 2.2);
      svg.appendChild(dot);
    }
    var title = document.createElementNS(SVG, "title");
    title.textContent = values.length ? "TTFT over the last " + points.length +
      " probes: min " + ms(Math.min.apply(null, values)) + ", max " +
      ms(Math.max.apply(null, values)) : "no first token yet";
    svg.appendChild(title);
    return svg;
  }

  function detail(text) {  // what the engine answered: two lines, all of it on hover
    var node = el("div", "small muted detail", text);
    node.setAttribute("title", String(text));
    return node;
  }

  function flags(e) {
    var out = [];
    if (e.cause === "override" || e.cause === "drained") {
      out.push(badge(e.cause === "drained" ? "drained" : "override", "flag"));
    }
    var ov = e.override;
    if (ov && typeof ov === "object") {
      out.push(badge("forced " + String(ov.state || ""), "flag"));
      if (ov.reason) { out.push(el("div", "small", ov.reason)); }
    }
    var until = e.override_until !== undefined ? e.override_until : ov && ov.until;
    if (typeof until === "number") {
      out.push(el("div", "small muted", "until " + new Date(until * 1000).toLocaleTimeString()));
    }
    if (e.signals && typeof e.signals === "object") {
      Object.keys(e.signals).forEach(function (source) {
        out.push(badge("signal " + source, "unhealthy"));
        out.push(el("div", "small", e.signals[source]));
      });
    }
    if (e.limits && typeof e.limits === "object") {
      Object.keys(e.limits).forEach(function (source) {
        out.push(badge("limit " + source, "degraded"));
        out.push(el("div", "small", e.limits[source]));
      });
    }
    if (e.removing) { out.push(badge("removing", "draining")); }
    return out.length ? out : [el("span", "muted", "-")];
  }

  function render(doc) {
    var fleet = doc.fleet && typeof doc.fleet === "object" ? doc.fleet : null;
    var owners = fleet && fleet.endpoints && typeof fleet.endpoints === "object"
      ? fleet.endpoints : {};
    var counts = {}, seen = new Set(), main = $("clusters");
    (doc.clusters || []).forEach(function (cd) {
      var name = String(cd.name), c = cluster(name), live = new Set();
      seen.add(name);
      main.appendChild(c.section);  // (re)placed in the document's order
      c.meta.textContent = (cd.warm ? "warm" : "not warm yet") +
        (cd.envoy_version ? " \u00b7 version " + cd.envoy_version : "") +
        " \u00b7 " + (cd.endpoints || []).length + " endpoint(s)";
      (cd.endpoints || []).forEach(function (e) {
        var address = String(e.address), key = name + "|" + address, r = row(c, address);
        var state = known(e.state, STATES), probe = e.last_probe, envoy = e.envoy || {};
        live.add(address);
        counts[state] = (counts[state] || 0) + 1;
        c.tbody.appendChild(r.tr);
        r.tr.className = "ep s-" + state;
        r.tr.setAttribute("data-endpoint", address);
        r.tr.setAttribute("data-state", state);
        var owner = owners[key], who = [el("div", "mono addr", address)];
        if (owner && owner.owner) {
          who.push(el("div", "small muted", "owner " + owner.owner +
            (typeof owner.verdict_age_s === "number" && owner.verdict_age_s > 0
              ? " \u00b7 verdict " + owner.verdict_age_s.toFixed(1) + " s old" : "")));
        }
        fill(r.cells[0], who);
        fill(r.cells[1], [badge(String(e.state), state),
          el("div", "small muted", "for " + ago(e.since_epoch))]);
        fill(r.cells[2], [badge(String(envoy.health_status || "-"),
          known(envoy.health_status, ENVOY)),
          el("div", "small", "weight " + String(envoy.weight) +
            (e.base_weight !== undefined && e.base_weight !== envoy.weight
              ? " (base " + String(e.base_weight) + ")" : "")),
          envoy.lb_label ? el("div", "small muted", "label " + envoy.lb_label) : null]);
        fill(r.cells[3], probe ? [badge(String(probe.outcome), known(probe.outcome, OUTCOMES)),
          el("div", "small", "TTFT " + ms(probe.ttft_ms) +
            (probe.status ? " \u00b7 HTTP " + probe.status : "")),
          probe.detail ? detail(probe.detail) : null]
          : [el("span", "muted", "no probe yet")]);
        fill(r.cells[4], [spark(remember(key, probe))]);
        fill(r.cells[5], [el("div", "reason", e.reason),
          el("div", "small muted", "cause " + String(e.cause))]);
        fill(r.cells[6], flags(e));
      });
      c.rows.forEach(function (r, address) {
        if (!live.has(address)) { r.tr.remove(); c.rows.delete(address); }
      });
    });
    clusters.forEach(function (c, name) {
      if (!seen.has(name)) { c.section.remove(); clusters.delete(name); }
    });
    $("summary").textContent = STATES.filter(function (s) { return counts[s]; })
      .map(function (s) { return counts[s] + " " + s; }).join(" \u00b7 ") || "no endpoints";
    var parts = ["revision " + String(doc.revision), "generated " + String(doc.generated_at)];
    if (fleet) {
      parts.push("fleet " + String(fleet.mode) + " (" + String(fleet.members) +
        " member(s), me " + String(fleet.member_id) + ")");
    }
    if (doc.xds && typeof doc.xds === "object") {
      var x = {pushes: 0, acks: 0, nacks: 0};
      Object.keys(doc.xds).forEach(function (k) {
        var v = doc.xds[k];
        if (v && typeof v === "object") {
          Object.keys(x).forEach(function (n) { if (typeof v[n] === "number") { x[n] += v[n]; } });
        }
      });
      parts.push("xDS " + x.pushes + " pushes, " + x.acks + " acks, " + x.nacks + " nacks");
    }
    $("meta").textContent = parts.join(" \u00b7 ");
  }

  function connection() {
    var fresh = page.lastOk && Date.now() - page.lastOk < STALE_MS;
    $("conn").className = fresh ? "live" : "stale";
    $("conn").textContent = fresh ? "\u25cf live" : "\u25cf stale";
  }

  function poll() {
    var ctl = new AbortController(), timer = setTimeout(function () { ctl.abort(); }, 5000);
    fetch("status", {cache: "no-store", headers: {Accept: "application/json"},
      credentials: "same-origin", signal: ctl.signal})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (doc) {
        render(doc);
        page.polls += 1;
        page.lastOk = Date.now();
        $("error").className = "";
      })
      .catch(function (err) {
        page.errors += 1;
        $("error").className = "on";
        $("error").textContent = "cannot read /status: " + String(err && err.message || err) +
          " (showing the last data received)";
      })
      .then(function () {
        clearTimeout(timer);
        connection();
        setTimeout(poll, POLL_MS);
      });
  }

  connection();
  poll();
})();
