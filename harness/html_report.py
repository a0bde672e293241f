"""The static HTML report: one self-contained file, no server, no network.

For each matrix (a CLI run, or each marked test of a pytest run) the page shows a
heatmap: one row per crash point (grouped by conversation, in golden-trace order), one
column per fault kind, each cell one single-fault case coloured by its outcome (pass,
fail, harness error; grey where the matrix has no such case). Plans of several faults
(``--depth 2``, Hypothesis examples) are listed under the heatmap. Clicking a cell or a
row opens the case's details: outcome, every failed check with its details and diff,
the crash point's source location, how each worker ended, timings, the plan as JSON and
the replay command (with a copy button).

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

OUTCOMES = ("pass", "fail", "harness-error")


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


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _column(case_id: str, point: str) -> str:
    """A single fault's column: its kind, or for a ``net`` fault the whole fault but its
    point (``net:db.reset_peer~db.reconnect[db]#1``): the network section lands several
    toxics at one point, each its own column."""
    label = case_id.split("/", 2)[2]
    return label.replace(f"@{point}", "", 1)


def _heatmap(mi: int, m: dict[str, Any]) -> str:
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
    out = [f'<table class="heatmap" id="heatmap-{mi}"><thead><tr><th>crash point</th>']
    out += [f"<th>{_e(k)}</th>" for k in kinds]
    out.append("</tr></thead><tbody>")
    conv_seen = None
    for (conv, point), cells in rows.items():
        if conv != conv_seen:
            out.append(f'<tr class="conv"><th colspan="{len(kinds) + 1}">{_e(conv)}</th></tr>')
            conv_seen = conv
        out.append(f'<tr><th class="point">{_e(point)}</th>')
        for k in kinds:
            ci = cells.get(k)
            if ci is None:
                out.append('<td class="cell none" title="no such case"></td>')
                continue
            c = m["cases"][ci]
            mark = {"pass": "", "fail": "&#x2717;", "harness-error": "!"}.get(c["outcome"], "?")
            out.append(f'<td class="cell {_e(c["outcome"])}" data-matrix="{mi}" data-case="{ci}" '
                       f'title="{_e(c["id"])}: {_e(c["outcome"])}" tabindex="0">{mark}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    if multi:
        out.append(f'<h3>plans of several faults ({len(multi)})</h3><table class="multi"><tbody>')
        for ci in multi:
            c = m["cases"][ci]
            out.append(f'<tr class="case-row {_e(c["outcome"])}" data-matrix="{mi}" data-case="{ci}" tabindex="0">'
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
td.cell.none{background:#e4e4e4;cursor:default}
td.cell.selected{outline:3px solid #1565c0}
table.multi td{padding:.1em .5em;font-family:monospace;font-size:12px}tr.case-row{cursor:pointer}
.legend span{display:inline-block;padding:0 .6em;margin-right:.4em;color:#fff}
pre{background:#fff;border:1px solid #ddd;padding:.5em;overflow:auto;font-size:12px}
.check{margin:.6em 0}.invalid{color:#d32f2f}.unknown{color:#b07800}.valid{color:#2e8b57}
code.replay{display:block;background:#222;color:#eee;padding:.5em;white-space:pre-wrap;word-break:break-all}
button{margin-top:.3em}
"""

_JS = """
(function(){
  var data = JSON.parse(document.getElementById('crashmatrix-data').textContent);
  var matrices = data.matrices || [data];
  var panel = document.getElementById('details');
  function el(tag, cls, text){var e=document.createElement(tag); if(cls) e.className=cls; if(text!==undefined) e.textContent=text; return e;}
  function show(mi, ci){
    var c = matrices[mi].cases[ci];
    document.querySelectorAll('td.cell.selected').forEach(function(x){x.classList.remove('selected');});
    document.querySelectorAll('[data-matrix="'+mi+'"][data-case="'+ci+'"]').forEach(function(x){ if(x.tagName==='TD') x.classList.add('selected');});
    panel.className=''; panel.innerHTML='';
    panel.appendChild(el('h2', 'case-id', c.id));
    panel.appendChild(el('p', 'outcome ' + c.outcome, 'outcome: ' + c.outcome + (c.failed_check ? ' (' + c.failed_check + ')' : '')));
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
  }
  document.querySelectorAll('[data-case]').forEach(function(x){
    var open = function(ev){ ev.stopPropagation(); show(+x.dataset.matrix, +x.dataset.case); };
    x.addEventListener('click', open);
    x.addEventListener('keydown', function(ev){ if (ev.key === 'Enter') open(ev); });
  });
})();
"""


def render_html(data: dict[str, Any], title: str = "crashmatrix report") -> str:
    """The report page for ``data`` (a JSON report, see the module docstring)."""
    matrices = _matrices(data)
    for m in matrices:
        _add_locations(m)
    body = [f"<h1>{_e(title)}</h1>",
            '<p class="legend"><span style="background:#2e8b57">pass</span><span style="background:#d32f2f">fail</span>'
            '<span style="background:#f0a500">harness error</span><span style="background:#bbb">no case</span>'
            + (f" seed {_e(data['seed'])}" if "seed" in data else "") + "</p>"]
    for mi, m in enumerate(matrices):
        s = m.get("summary", {})
        heading = f"{m['workload']} on {m['subject']}" + (f" ({m['test']})" if m.get("test") else "")
        body.append(f'<section class="matrix" id="matrix-{mi}"><h2>{_e(heading)}</h2>')
        body.append(f'<p class="summary">{_e(s.get("cases", len(m.get("cases", []))))} cases: '
                    f'{_e(s.get("pass", 0))} passed, {_e(s.get("fail", 0))} failed, '
                    f'{_e(s.get("harness-error", 0))} harness errors; kinds {_e(", ".join(m.get("kinds", [])))}; '
                    f'sources {_e(", ".join(m.get("sources", [])))}'
                    + (f"; shard {_e(m['shard'])}" if m.get("shard") else "") + "</p>")
        body.append(_heatmap(mi, m))
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
