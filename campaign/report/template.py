# ruff: noqa: E501  (HTML and CSS lines of the template)
"""The HTML report's Jinja2 template (autoescaped: every ledger string is text).

Order is what a reader needs first: the answer, the integrity flags, the
variants and their curves, then the evidence (deltas, relaunches, every run,
the pilot, notes). The run table fits 1,400 px; each run's long fields are
in a details row that opens on click (no script).
"""

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>{{ campaign.name }} — balance sheet</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #111; max-width: 1360px; }
table { border-collapse: collapse; margin: 0.5em 0 1.4em; font-size: 12px; max-width: 100%; }
th, td { border: 1px solid #bbb; padding: 3px 6px; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th { background: #eee; white-space: nowrap; }
td.n { white-space: nowrap; }
tr.diverged td, tr.failed td, tr.oom td { background: #fdecea; }
tr.interrupted td, tr.lost td, tr.stopped td { background: #fff6e0; }
tr.withdrawn:not(.details) td { color: #777; text-decoration: line-through; }
tr.details td { background: #fafafa; font-size: 11px; }
details summary { cursor: pointer; color: #245; }
dl { display: grid; grid-template-columns: max-content auto; gap: 1px 12px; margin: 4px 0; }
dt { color: #555; } dd { margin: 0; overflow-wrap: anywhere; }
.conclusion { font-size: 16px; background: #eef5ee; border-left: 4px solid #393; padding: 0.6em 1em; }
.flagged { background: #fff3e0; border-left: 4px solid #e80; padding: 0.4em 1em; }
.why { color: #666; font-style: italic; }
.better { color: #186a1e; font-weight: 600; } .worse { color: #a01818; font-weight: 600; }
img { max-width: 100%; }
.meta { color: #555; }
@media print { body { margin: 0.5cm; } img { page-break-inside: avoid; } details { display: block; } }
</style></head><body>
{%- macro table(frame, css="") -%}
{%- if frame.rows -%}
<table class="{{ css }}"><thead><tr>{% for c in frame.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in frame.rows %}<tr>{% for v in row %}<td{% if v|length < 16 %} class="n"{% endif %}>{{ v }}</td>{% endfor %}</tr>{% endfor %}</tbody></table>
{%- else -%}<p class="why">(none)</p>{%- endif -%}
{%- endmacro %}
<h1>{{ campaign.name }}</h1>
<p class="meta">task {{ campaign.task }} · spec sha256 {{ campaign.spec_sha256[:16] }}… ·
metric {{ sheet.metric }} ({{ "higher" if sheet.mode == "max" else "lower" }} is better) ·
generated {{ generated }}</p>
<h2 id="conclusion">Conclusion</h2>
<p class="conclusion">{{ sheet.conclusion }}</p>
{% if conclusions.rows %}
<table id="conclusions"><thead><tr>{% for c in conclusions.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in conclusions.rows %}<tr>{% for v in row %}
<td{% if loop.index0 == 7 %} class="{{ v }}"{% endif %}>{{ v }}</td>{% endfor %}</tr>{% endfor %}</tbody></table>
<p class="meta">95% interval: paired Student t over the seeds where both the variant and the
control have a value; fewer than 3 pairs: not estimable.</p>
{% endif %}
{% if search %}
<h2 id="search">Search</h2>
<p class="meta">{{ search.summary }}</p>
<h3>Confirmation on fresh seeds</h3>
<p class="meta">The search's estimate of each chosen variant beside the confirmation's: the
difference (selection) is how much of the search's gain came from picking the best of many
noisy values.</p>
{{ table(search.confirmation) }}
<h3>Audit of pruning</h3>
<p>{{ search.audit }}</p>
<h3>Space explored</h3>
{% if search.chart %}<img alt="the searched keys against {{ sheet.metric }}" src="data:image/png;base64,{{ search.chart }}">{% else %}<p class="why">nothing to draw yet</p>{% endif %}
{{ table(search.variants) }}
<h3>Rung decisions</h3>
{{ table(search.decisions) }}
{% endif %}
<h2 id="flags">Integrity flags</h2>
{% if flags.rows %}
<p class="flagged">{{ flags.rows|length }} flag{{ "s" if flags.rows|length > 1 }}:
{% for kind, count in flag_counts.items() %}{{ kind }} {{ count }}{{ ", " if not loop.last }}{% endfor %}.
A flagged run keeps its line and its value; the flag says why the value may not mean what it seems.</p>
{{ table(flags) }}
{% else %}<p class="why">None: every finished run replayed identically, started through a passing
pilot on the same stack, and kept the plan.</p>{% endif %}
<h2 id="variants">Variants ({{ variants_heading }})</h2>
{{ table(variants) }}
<h2 id="curves">Curves</h2>
{% for chart in charts %}
<h3>{{ chart.key }}</h3>
{% if chart.png %}<img alt="{{ chart.key }} of every run, by variant"
     src="data:image/png;base64,{{ chart.png }}">
{% else %}<p class="why">No {{ chart.key }} curve: {{ chart.why }}.</p>{% endif %}
{% endfor %}
<h2 id="deltas">Deltas against the control, seed by seed</h2>
{{ table(deltas) }}
<h2 id="relaunches">Relaunches (never pooled into a variant)</h2>
{{ table(relaunches) }}
<h2 id="runs">Every run</h2>
<table id="run-table"><thead><tr>{% for c in summary_columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for run in runs %}
<tr class="{{ run.status }}">{% for c in summary_columns %}<td>{{ run.cells[c] }}</td>{% endfor %}</tr>
<tr class="details {{ run.status }}"><td colspan="{{ summary_columns|length }}"><details><summary>details</summary>
<dl>{% for k, v in run.details.items() %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl></details></td></tr>
{% endfor %}</tbody></table>
<h2 id="pilot">Pilot: phases</h2>
{% if phases.rows %}{{ table(phases) }}{% else %}<p class="why">No pilot has run yet.</p>{% endif %}
{% if memory %}<img alt="what each pilot phase adds to memory" src="data:image/png;base64,{{ memory }}">
{% else %}<p class="why">No memory chart: {{ memory_why }}.</p>{% endif %}
<h2 id="notes">Notes</h2>
{{ table(notes) }}
</body></html>
"""
