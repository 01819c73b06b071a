"""HTML pieces of report.html: one self-contained page (PNGs as data: URIs, no script, no remote file), its
sections in the order a reader asks: what ran, did it learn, is it healthy, where did the time go."""

from __future__ import annotations

import base64
import html
from typing import Any

from tools.report.table import COLUMNS, cell

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1250px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f3f3f3}
table.kv th{text-align:left;white-space:nowrap} table.kv td{text-align:left}
.figs{display:flex;flex-wrap:wrap;gap:1em}
figure{margin:0 0 .6em 0} .figs figure{flex:0 1 400px} figure.wide{max-width:760px}
.figs figure.wide{flex:0 1 620px}
figcaption{font-size:12px;color:#444;margin-top:.2em}
img{max-width:100%;border:1px solid #eee}
.absent{border:1px dashed #bbb;background:#fafafa;padding:.6em .8em;max-width:580px;font-size:13px}
.figs .absent{flex:0 1 380px;align-self:flex-start}
.note{color:#8a4b00} code{font-size:12px;background:#f5f5f5;padding:0 2px}
p.sub{color:#555;margin-top:0} p{font-size:14px}
"""


def esc(x: Any) -> str:
    return html.escape(str(x))


def codes(keys: list[str]) -> str:
    return ", ".join(f"<code>{esc(k)}</code>" for k in keys)


def figure(name: str, data: bytes, caption: str, wide: bool = False) -> str:
    stem = name.rsplit(".", 1)[0]
    src = "data:image/png;base64," + base64.b64encode(data).decode()
    return (
        f'<figure id="fig-{esc(stem)}"{" class=wide" if wide else ""}><img alt="{esc(name)}" src="{src}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def absent(name: str, title: str, why: str, keys: list[str]) -> str:
    stem = name.rsplit(".", 1)[0]
    return (
        f'<div class="absent" id="absent-{esc(stem)}"><b>{esc(title)}</b>: not drawn. {esc(why)} '
        f"(verl: {codes(keys)}).</div>"
    )


def kv_table(labels: list[str], rows: list[tuple[str, list[str]]]) -> str:
    """A key/value table; with several runs, one column a run. Values are HTML already."""
    head = (
        "" if len(labels) < 2 else "<tr><th></th>" + "".join(f"<th>{esc(x)}</th>" for x in labels) + "</tr>"
    )
    body = "".join(
        f"<tr><th>{esc(k)}</th>" + "".join(f"<td>{v}</td>" for v in vals) + "</tr>" for k, vals in rows
    )
    return f'<table class="kv">{head}{body}</table>'


def step_table(rows: list[dict[str, Any]], unit: str, table_id: str) -> str:
    heads = "".join(f"<th>{esc(c.head.format(unit=unit))}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{esc(cell(c, r))}</td>" for c in COLUMNS) + "</tr>" for r in rows)
    return f'<table id="{esc(table_id)}"><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table>'


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>\n{body}\n</section>\n'


def document(title: str, subtitle: str, sections: list[str]) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{CSS}</style></head>\n<body>\n<h1>{esc(title)}</h1>\n<p class=sub>{subtitle}</p>\n"
        + "".join(sections)
        + "</body></html>\n"
    )
