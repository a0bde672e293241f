"""The static HTML report: one self-contained file, no server, no network.

For each matrix (a CLI run, or each marked test of a pytest run) the page shows a
heatmap: one row per crash point (grouped by conversation, in golden-trace order), one
column per fault kind, each cell one single-fault case coloured by its outcome (pass,
fail, flaky, harness error; not run and not applicable, which tested nothing, in pale
hatched grey apart from the failures; grey where the matrix has no such case). Under
the heatmap, the cases that tested nothing are listed apart, a line per fault kind (not
run) or resume policy (not applicable) with the reason. Plans of several
faults (``--depth 2``, Hypothesis examples) are listed under the heatmap. Clicking a
cell or a row opens the case's details: outcome (for a replayed failure, each run's
outcome), every failed check with its details and diff, the crash point's source
location, how each worker ended, timings, the plan as JSON and the replay command (with
a copy button). A "failing cases only" box hides the rows with no failing case.

**Links to one case**: each case's cell (or row) carries the case id as its HTML id,
so ``report.html#CASE_ID`` (the id as printed, e.g.
``report.html#checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1``, or
percent-encoded) scrolls to it and opens its details, as does the pytest item id
(``report.html#tests/test_x.py::test_checkout[conv1/kill@...#1]``, or its
``test_checkout[...]`` or bracketed part alone: the case id without its workload, the
first matrix's case where several match); opening a case puts its id in the address bar. When one case id appears in several matrices of a pytest report, the
first keeps the bare id and the N-th (N > 1, counting from 1) gets ``matrix-N/CASE_ID``
(:func:`anchor_ids`). A report of a run stopped early (Ctrl-C, SIGTERM) says so above
its heatmap.

The data is the JSON report itself (:func:`.report.write_json`'s shape, a single matrix,
or the pytest plugin's ``{"matrices": [...]}``), embedded in the page; CSS and the
script that opens details are inline, and the page loads nothing else (no fonts, no
images, no scripts from anywhere).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

OUTCOMES = ("pass", "fail", "flaky", "harness-error", "not-run", "not-applicable")
FAILING = ("fail", "flaky", "harness-error")
"""Outcomes the "failing cases only" filter keeps (not run and not applicable tested
nothing: never counted as failing)."""


def _matrices(data: dict[str, Any]) -> list[dict[str, Any]]:
    return list(data["matrices"]) if "matrices" in data else [data]


def _add_locations(m: dict[str, Any]) -> None:
    """Fill in each case's ``location`` (CLI reports have none) where it can be found."""
    if all("location" in c for c in m.get("cases", [])):
        return
    from .sources import point_location, subject_sources

    try:
        srcs = subject_sources(m["subject"], m["workload"])
    except Exception:  # an adapter that no longer imports: the report still renders
        srcs = None
    for c in m.get("cases", []):
        if "location" not in c and c.get("plan", {}).get("faults"):
            p = c["plan"]["faults"][0]["point"]
            c["location"] = point_location(p["name"], p["source"], srcs)


def anchor_ids(matrices: list[dict[str, Any]]) -> list[list[str]]:
    """The HTML id of each case of each matrix (``[matrix][case]``): the case id, or
    ``matrix-N/CASE_ID`` for a case id already used by an earlier matrix (N: the
    matrix's position, from 1). Stable: the same report gives the same ids."""
    seen: set[str] = set()
    out = []
    for mi, m in enumerate(matrices):
        ids = []
        for c in m.get("cases", []):
            anchor = c["id"] if c["id"] not in seen else f"matrix-{mi + 1}/{c['id']}"
            seen.add(anchor)
            ids.append(anchor)
        out.append(ids)
    return out


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _column(case_id: str, point: str) -> str:
    """A single fault's column: its kind, or for a ``net`` fault the whole fault but its
    point (``net:db.reset_peer~db.reconnect[db]#1``): the network section lands several
    toxics at one point, each its own column."""
    label = case_id.split("/", 2)[2]
    return label.replace(f"@{point}", "", 1)


def _heatmap(mi: int, m: dict[str, Any], anchors: list[str]) -> str:
    kinds = [k for k in m.get("kinds") or [] if k != "net"]  # net: a column per toxic, added below
    rows: dict[tuple[str, str], dict[str, int]] = {}
    multi: list[int] = []
    for ci, c in enumerate(m.get("cases", [])):
        faults = c.get("plan", {}).get("faults", [])
        if len(faults) != 1:
            multi.append(ci)
            continue
        f = faults[0]
        p = f["point"]
        conv = c["id"].split("/")[1]
        point = f"{p['name']}[{p['task']}]#{p['occurrence']}"
        column = _column(c["id"], point) if f["kind"] == "net" else f["kind"]
        rows.setdefault((conv, point), {})[column] = ci
        if column not in kinds:
            kinds.append(column)
    failing_convs = {conv for (conv, _), cells in rows.items()
                     if any(m["cases"][ci]["outcome"] in FAILING for ci in cells.values())}
    out = [f'<table class="heatmap" id="heatmap-{mi}"><thead><tr><th>crash point</th>']
    out += [f"<th>{_e(k)}</th>" for k in kinds]
    out.append("</tr></thead><tbody>")
    conv_seen = None
    for (conv, point), cells in rows.items():
        if conv != conv_seen:
            mark = " has-failure" if conv in failing_convs else ""
            out.append(f'<tr class="conv{mark}"><th colspan="{len(kinds) + 1}">{_e(conv)}</th></tr>')
            conv_seen = conv
        failing = any(m["cases"][ci]["outcome"] in FAILING for ci in cells.values())
        out.append(f'<tr class="point-row{" has-failure" if failing else ""}"><th class="point">{_e(point)}</th>')
        for k in kinds:
            ci = cells.get(k)
            if ci is None:
                out.append('<td class="cell none" title="no such case"></td>')
                continue
            c = m["cases"][ci]
            mark = {"pass": "", "fail": "&#x2717;", "flaky": "~", "harness-error": "!", "not-run": "&#x2013;",
                    "not-applicable": "n/a"}.get(c["outcome"], "?")
            out.append(f'<td class="cell {_e(c["outcome"])}" id="{_e(anchors[ci])}" data-matrix="{mi}" data-case="{ci}" '
                       f'title="{_e(c["id"])}: {_e(c["outcome"])}" tabindex="0">{mark}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    if multi:
        out.append(f'<h3>plans of several faults ({len(multi)})</h3><table class="multi"><tbody>')
        for ci in multi:
            c = m["cases"][ci]
            failing = " has-failure" if c["outcome"] in FAILING else ""
            out.append(f'<tr class="case-row {_e(c["outcome"])}{failing}" id="{_e(anchors[ci])}" data-matrix="{mi}" '
                       f'data-case="{ci}" tabindex="0">'
                       f'<td class="cell {_e(c["outcome"])}" data-matrix="{mi}" data-case="{ci}"></td>'
                       f"<td>{_e(c['id'])}</td><td>{_e(c['outcome'])}</td></tr>")
        out.append("</tbody></table>")
    return "".join(out)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;display:flex;color:#222}
main{flex:1;padding:1em 1.5em;overflow:auto}
aside{width:42%;max-width:48em;border-left:1px solid #ccc;padding:1em;overflow:auto;height:100vh;box-sizing:border-box;position:sticky;top:0;background:#fafafa}
aside.empty{color:#777}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}h3{font-size:1em}
table.heatmap{border-collapse:collapse}
table.heatmap th{font-weight:normal;text-align:left;padding:0 .6em 0 0;font-family:monospace;font-size:12px}
table.heatmap thead th{font-family:inherit;font-weight:bold;text-align:center;padding:.2em .4em}
tr.conv th{font-weight:bold;padding-top:.6em;font-family:inherit}
td.cell{width:2.2em;height:1.2em;border:1px solid #fff;text-align:center;cursor:pointer;color:#fff;font-weight:bold}
td.cell.pass{background:#2e8b57}td.cell.fail{background:#d32f2f}td.cell.harness-error{background:#f0a500}
td.cell.flaky{background:#8e24aa}
td.cell.not-run,td.cell.not-applicable{background:repeating-linear-gradient(45deg,#ddd,#ddd 3px,#f4f4f4 3px,#f4f4f4 6px);color:#555;font-weight:normal;font-size:10px}
body.failing-only tr.point-row:not(.has-failure),body.failing-only tr.conv:not(.has-failure),
body.failing-only tr.case-row:not(.has-failure){display:none}
p.incomplete{background:#fff3cd;border:1px solid #f0a500;padding:.4em .6em}
.filter{margin:.5em 0}
td.cell.none{background:#e4e4e4;cursor:default}
td.cell.selected{outline:3px solid #1565c0}
table.multi td{padding:.1em .5em;font-family:monospace;font-size:12px}tr.case-row{cursor:pointer}
.legend span{display:inline-block;padding:0 .6em;margin-right:.4em;color:#fff}
pre{background:#fff;border:1px solid #ddd;padding:.5em;overflow:auto;font-size:12px}
.check{margin:.6em 0}.invalid{color:#d32f2f}.unknown{color:#b07800}.valid{color:#2e8b57}.flaky{color:#8e24aa}
code.replay{display:block;background:#222;color:#eee;padding:.5em;white-space:pre-wrap;word-break:break-all}
button{margin-top:.3em}
"""

_JS = """
(function(){
  var data = JSON.parse(document.getElementById('crashmatrix-data').textContent);
  var matrices = data.matrices || [data];
  var panel = document.getElementById('details');
  function el(tag, cls, text){var e=document.createElement(tag); if(cls) e.className=cls; if(text!==undefined) e.textContent=text; return e;}
  var WORDS = {'pass': 'passed', 'fail': 'failed', 'harness-error': 'hit a harness error'};
  function runs(outcomes){
    return outcomes.map(function(o, i){ return (WORDS[o] || o) + ' on ' + (i === 0 ? 'the first run' : 'replay ' + i); }).join(', ');
  }
  function show(mi, ci, anchor){
    var c = matrices[mi].cases[ci];
    document.querySelectorAll('td.cell.selected').forEach(function(x){x.classList.remove('selected');});
    document.querySelectorAll('[data-matrix="'+mi+'"][data-case="'+ci+'"]').forEach(function(x){ if(x.tagName==='TD') x.classList.add('selected');});
    panel.className=''; panel.innerHTML='';
    panel.appendChild(el('h2', 'case-id', c.id));
    panel.appendChild(el('p', 'outcome ' + c.outcome, 'outcome: ' + c.outcome + (c.failed_check ? ' (' + c.failed_check + ')' : '')));
    if (c.replays && c.replays.length) {
      panel.appendChild(el('p', 'runs ' + c.outcome, 'runs: ' + runs(c.outcomes) + (c.outcome === 'flaky' ?
        ': the verdict differs between runs of the same case (a race in the subject; counted as a failure)' : '')));
      c.replays.forEach(function(r, i){
        var checks = (r.verdicts || []).map(function(v){return v.check;});
        panel.appendChild(el('p', 'replay-run ' + r.outcome, 'replay ' + (i + 1) + ': ' + r.outcome +
          (checks.length ? ' (' + checks.join(', ') + ')' : '') + (r.error ? '; ' + r.error.split('\\n')[0] : '') + ', run ' + r.run_id));
      });
    }
    panel.appendChild(el('p', 'subject', 'subject ' + c.subject + ', run ' + c.run_id + ', ' + c.seconds + ' s'));
    if (c.location) panel.appendChild(el('p', 'location', 'crash point at ' + c.location));
    if (c.error) panel.appendChild(el('pre', 'error', c.error));
    (c.verdicts || []).forEach(function(v){
      if (v.verdict === 'valid') return;
      var d = el('div', 'check');
      d.appendChild(el('div', v.verdict, v.phase + ' check ' + v.check + ': ' + v.verdict + ': ' + v.details));
      if (v.diff && v.diff.length) d.appendChild(el('pre', 'diff', v.diff.join('\\n')));
      panel.appendChild(d);
    });
    var ok = (c.verdicts || []).filter(function(v){return v.verdict==='valid';}).map(function(v){return v.check;});
    if (ok.length) panel.appendChild(el('p', 'valid-checks', 'valid: ' + ok.join(', ')));
    if (c.workers && c.workers.length) {
      panel.appendChild(el('h3', null, 'workers'));
      panel.appendChild(el('pre', 'workers', c.workers.map(function(w){
        return w.role + ' pid ' + w.pid + ' ' + (w.signal !== null ? 'signal ' + w.signal : 'exit ' + w.returncode) +
          ' ' + w.seconds + ' s' + (w.cpu_ms !== null && w.cpu_ms !== undefined ? ', cpu ' + w.cpu_ms + ' ms' : '') + (w.timed_out ? ' (timed out)' : '');
      }).join('\\n')));
    }
    panel.appendChild(el('h3', null, 'plan'));
    panel.appendChild(el('pre', 'plan', JSON.stringify(c.plan, null, 1)));
    panel.appendChild(el('h3', null, 'replay'));
    var code = el('code', 'replay', c.replay); panel.appendChild(code);
    var b = el('button', 'copy', 'copy replay command');
    b.onclick = function(){ if (navigator.clipboard) navigator.clipboard.writeText(c.replay); b.textContent='copied'; };
    panel.appendChild(b);
    if (anchor) {
      var link = el('a', 'permalink', 'link to this case'); link.href = '#' + encodeURIComponent(anchor);
      panel.appendChild(el('p')).appendChild(link);
    }
  }
  function anchorOf(x){
    var n = x.id ? x : x.closest('[id]');
    return n && n.dataset.case !== undefined ? n.id : null;
  }
  document.querySelectorAll('[data-case]').forEach(function(x){
    var open = function(ev){
      ev.stopPropagation();
      var anchor = anchorOf(x);
      show(+x.dataset.matrix, +x.dataset.case, anchor);
      if (anchor && history.replaceState) history.replaceState(null, '', '#' + encodeURIComponent(anchor));
    };
    x.addEventListener('click', open);
    x.addEventListener('keydown', function(ev){ if (ev.key === 'Enter') open(ev); });
  });
  function caseFor(id){
    var x = document.getElementById(id);
    if (x && x.dataset.case !== undefined) return x;
    // a pytest item id, [path::]test[CASE_ID without its workload], or that param alone
    var m = /^(?:.*::)?[^\\[\\/]*\\[(.*)\\]$/.exec(id);
    var rest = m ? m[1] : id;
    var all = document.querySelectorAll('[data-case][id]');
    for (var i = 0; i < all.length; i++) {
      if (all[i].id === rest || all[i].id.slice(-rest.length - 1) === '/' + rest) return all[i];
    }
    return null;
  }
  function fromHash(){
    var h = location.hash.slice(1);
    if (!h) return;
    var id = h;
    try { id = decodeURIComponent(h); } catch (e) {}
    var x = caseFor(id) || caseFor(h);
    if (!x) return;
    show(+x.dataset.matrix, +x.dataset.case, x.id);
    x.scrollIntoView({block: 'center'});
  }
  window.addEventListener('hashchange', fromHash);
  fromHash();
  var filter = document.getElementById('failing-only');
  function applyFilter(){ document.body.classList.toggle('failing-only', filter.checked); }
  filter.addEventListener('change', applyFilter);
  applyFilter();
})();
"""


def _incomplete(d: dict[str, Any]) -> str:
    if d.get("complete", True):
        return ""
    planned = f"; {len(d.get('cases', []))} of {d['planned']} case(s) ran" if d.get("planned") else ""
    return f'<p class="incomplete">incomplete: {_e(d.get("reason") or "the run stopped early")}{_e(planned)}</p>'


def _non_events(m: dict[str, Any]) -> str:
    """The matrix's cases that tested nothing, apart from the failures: a list per
    outcome, a line per fault kind (not run) or resume policy (not applicable) with the
    count and the reason (the JSON report's ``non_events``; a plugin report's matrix,
    which has none, is grouped here from its cases' errors)."""
    groups = m.get("non_events")
    if groups is None:
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for c in m.get("cases", []):
            if c.get("outcome") not in ("not-run", "not-applicable"):
                continue
            run = c["outcome"] == "not-run"
            faults = c.get("plan", {}).get("faults", [])
            name = faults[0]["kind"] if run and faults else c["id"].rsplit("/", 1)[-1]
            g = found.setdefault((c["outcome"], name), {"outcome": c["outcome"], "by": "kind" if run else "policy",
                                                       "name": name, "count": 0, "reason": c.get("error") or ""})
            g["count"] += 1
        groups = list(found.values())
    out = []
    for outcome, words in (("not-run", "not run"), ("not-applicable", "not applicable")):
        mine = [g for g in groups if g["outcome"] == outcome]
        if mine:
            out.append(f'<h3 class="{outcome}">{words} ({sum(g["count"] for g in mine)}; tested nothing, not counted '
                       f'as failed)</h3><ul class="{outcome}">')
            out += [f"<li>{_e(g['by'])} {_e(g['name'])}: {_e(g['count'])} case(s): {_e(g['reason'])}</li>" for g in mine]
            out.append("</ul>")
    return "".join(out)


def render_html(data: dict[str, Any], title: str = "crashmatrix report") -> str:
    """The report page for ``data`` (a JSON report, see the module docstring)."""
    matrices = _matrices(data)
    for m in matrices:
        _add_locations(m)
    anchors = anchor_ids(matrices)
    body = [f"<h1>{_e(title)}</h1>",
            '<p class="legend"><span style="background:#2e8b57">pass</span><span style="background:#d32f2f">fail</span>'
            '<span style="background:#8e24aa">flaky</span>'
            '<span style="background:#f0a500">harness error</span>'
            '<span style="background:#ddd;color:#555">not run / not applicable</span><span style="background:#bbb">no case</span>'
            + (f" seed {_e(data['seed'])}" if "seed" in data else "") + "</p>",
            '<p class="filter"><label><input type="checkbox" id="failing-only"> failing cases only</label></p>']
    if "matrices" in data:
        body.append(_incomplete(data))
    for mi, m in enumerate(matrices):
        s = m.get("summary", {})
        heading = f"{m['workload']} on {m['subject']}" + (f" ({m['test']})" if m.get("test") else "")
        body.append(f'<section class="matrix" id="matrix-{mi}"><h2>{_e(heading)}</h2>')
        body.append(_incomplete(m))
        body.append(f'<p class="summary">{_e(s.get("cases", len(m.get("cases", []))))} cases: '
                    f'{_e(s.get("pass", 0))} passed, {_e(s.get("fail", 0))} failed, {_e(s.get("flaky", 0))} flaky, '
                    f'{_e(s.get("harness-error", 0))} harness errors'
                    + "".join(f", {_e(s[o])} {o.replace('-', ' ')}" for o in ("not-run", "not-applicable") if s.get(o))
                    + f'; kinds {_e(", ".join(m.get("kinds", [])))}; '
                    f'sources {_e(", ".join(m.get("sources", [])))}'
                    + (f"; shard {_e(m['shard'])}" if m.get("shard") else "") + "</p>")
        body.append(_heatmap(mi, m, anchors[mi]))
        body.append(_non_events(m))
        body.append("</section>")
    payload = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>{''.join(body)}</main>"
            '<aside id="details" class="empty">Click a cell for the case\'s details and replay command.</aside>'
            f'<script type="application/json" id="crashmatrix-data">{payload}</script>'
            f"<script>{_JS}</script></body></html>\n")


def write_html(data: dict[str, Any], path: Path, title: str | None = None) -> None:
    """Write :func:`render_html` of ``data`` to ``path`` (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    m = _matrices(data)
    default = f"crashmatrix: {m[0]['workload']} on {m[0]['subject']}" if len(m) == 1 else "crashmatrix report"
    path.write_text(render_html(data, title or default), encoding="utf-8")
