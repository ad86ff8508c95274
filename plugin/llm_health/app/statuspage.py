"""``GET /`` on the HTTP port: a live, read-only status page for humans (a browser or a
phone). One self-contained HTML document, no CDN, no internet: its CSS and JS are inline
and allowed by their SHA-256 hashes in a strict Content-Security-Policy (nothing else may
run or load; ``connect-src 'self'`` lets the script poll ``/status`` every second).

Every text from the status document (cluster and endpoint names, reasons, probe details:
they may quote what a backend answered) goes into the page through ``textContent``, never
as markup. TTFT sparklines are SVG built from the last :data:`SPARK_POINTS` probes the
page itself has seen (kept client-side across polls; a reload starts them anew).

Like ``/status`` it has no authentication: the HTTP port is meant for loopback or a
trusted network (docs/design.md §5).
"""

from __future__ import annotations

import base64
import hashlib

from aiohttp import web

POLL_MS = 1000
SPARK_POINTS = 30

_CSS = """
:root{--bg:#f6f7f9;--fg:#1b1f24;--muted:#5b6470;--card:#fff;--line:#dde1e6;
--ok:#1a7f37;--ok-bg:#dafbe1;--warn:#9a6700;--warn-bg:#fff1c2;--bad:#c9212b;
--bad-bg:#ffe0e0;--start:#0b5cad;--start-bg:#ddeeff;--drain:#6e40c9;--drain-bg:#eee5ff}
@media (prefers-color-scheme:dark){:root{--bg:#0f1216;--fg:#e6e9ed;--muted:#98a2ad;
--card:#171b21;--line:#2a3038;--ok:#4ac26b;--ok-bg:#12361f;--warn:#e3b341;
--warn-bg:#3a2e0c;--bad:#ff6b6b;--bad-bg:#431a1c;--start:#6cb6ff;--start-bg:#13304f;
--drain:#b392f0;--drain-bg:#2d2245}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header{position:sticky;top:0;z-index:1;background:var(--card);
border-bottom:1px solid var(--line);padding:8px 16px;display:flex;flex-wrap:wrap;
gap:6px 16px;align-items:center}
h1{font-size:17px;margin:0}
h2{font-size:15px;margin:0;overflow-wrap:anywhere}
.muted{color:var(--muted)}
.small{font-size:12px}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
overflow-wrap:anywhere}
#conn{font-weight:600}
#conn.live{color:var(--ok)}
#conn.stale{color:var(--bad)}
main{padding:12px 16px;max-width:1400px;margin:0 auto}
section.cluster{background:var(--card);border:1px solid var(--line);border-radius:8px;
margin:0 0 14px;overflow:hidden}
.chead{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:baseline;padding:10px 12px;
border-bottom:1px solid var(--line)}
table{width:100%;border-collapse:collapse}
th{text-align:left;font-size:12px;font-weight:600;color:var(--muted);
padding:6px 10px;border-bottom:1px solid var(--line);white-space:nowrap}
td{padding:7px 10px;border-bottom:1px solid var(--line);vertical-align:top}
tr:last-child td{border-bottom:0}
tr.ep{border-left:4px solid transparent}
tr.ep.s-healthy{border-left-color:var(--ok)}
tr.ep.s-degraded{border-left-color:var(--warn)}
tr.ep.s-unhealthy{border-left-color:var(--bad)}
tr.ep.s-starting{border-left-color:var(--start)}
tr.ep.s-draining{border-left-color:var(--drain)}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;
font-size:12px;white-space:nowrap;background:var(--line)}
.b-healthy,.b-fast,.b-HEALTHY{background:var(--ok-bg);color:var(--ok)}
.b-degraded,.b-slow{background:var(--warn-bg);color:var(--warn)}
.b-unhealthy,.b-fatal,.b-error,.b-timeout,.b-overloaded,.b-UNHEALTHY{
background:var(--bad-bg);color:var(--bad)}
.b-starting{background:var(--start-bg);color:var(--start)}
.b-draining,.b-DRAINING,.b-flag{background:var(--drain-bg);color:var(--drain)}
.reason{overflow-wrap:anywhere;max-width:40em}
.addr{white-space:nowrap}
.detail{overflow-wrap:anywhere;display:-webkit-box;-webkit-box-orient:vertical;
-webkit-line-clamp:2;overflow:hidden;max-width:28em}
.flags .badge{margin:0 4px 2px 0}
svg.spark{display:block;width:130px;height:30px}
svg.spark polyline{fill:none;stroke:var(--start);stroke-width:1.5}
svg.spark .fail{stroke:var(--bad);stroke-width:2}
svg.spark .last{fill:var(--start)}
#error{display:none;background:var(--bad-bg);color:var(--bad);padding:8px 16px}
#error.on{display:block}
@media (max-width:760px){
header{padding:8px 10px;position:static}main{padding:8px}
thead{display:none}
table,tbody,tr,td{display:block;width:100%}
tr.ep{border-bottom:1px solid var(--line);padding:4px 0}
td{border:0;padding:3px 10px;display:flex;gap:10px}
td::before{content:attr(data-label);flex:0 0 6.5em;color:var(--muted);font-size:12px;
font-weight:600}
td>div{min-width:0;flex:1}
.addr{white-space:normal;overflow-wrap:anywhere}
}
"""

_JS = """
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
        (cd.envoy_version ? " \\u00b7 version " + cd.envoy_version : "") +
        " \\u00b7 " + (cd.endpoints || []).length + " endpoint(s)";
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
              ? " \\u00b7 verdict " + owner.verdict_age_s.toFixed(1) + " s old" : "")));
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
            (probe.status ? " \\u00b7 HTTP " + probe.status : "")),
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
      .map(function (s) { return counts[s] + " " + s; }).join(" \\u00b7 ") || "no endpoints";
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
    $("meta").textContent = parts.join(" \\u00b7 ");
  }

  function connection() {
    var fresh = page.lastOk && Date.now() - page.lastOk < STALE_MS;
    $("conn").className = fresh ? "live" : "stale";
    $("conn").textContent = fresh ? "\\u25cf live" : "\\u25cf stale";
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
""".replace("__POLL_MS__", str(POLL_MS)).replace("__POINTS__", str(SPARK_POINTS))

_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>llm-health status</title>
<style>__CSS__</style>
</head>
<body>
<header>
<h1>llm-health</h1>
<span id="conn" class="stale">&#9679; connecting</span>
<span id="summary"></span>
<span id="meta" class="muted small"></span>
</header>
<div id="error" role="alert"></div>
<main id="clusters"></main>
<script>__JS__</script>
</body>
</html>
""".replace("__CSS__", _CSS).replace("__JS__", _JS)


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        f"script-src {_sha256(_JS)}",
        f"style-src {_sha256(_CSS)}",
        "connect-src 'self'",
        "img-src 'self'",  # the browser's own /favicon.ico request (a 404)
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
"""Only the page's own inline script and style (by hash) run; it may fetch from its own
origin and nothing else (no frames, forms, plugins, fonts or other origins)."""

HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

PAGE = _HTML.encode()


async def status_page(_request: web.Request) -> web.Response:
    """``GET /``: the page (static: it reads ``/status`` itself)."""
    return web.Response(body=PAGE, content_type="text/html", charset="utf-8", headers=dict(HEADERS))
