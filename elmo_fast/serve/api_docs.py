"""``GET /docs``: the OpenAPI description (:mod:`.openapi`) as one self-contained HTML page, written
here on the server: no script, no stylesheet or font from elsewhere, so it reads the same offline."""

from __future__ import annotations

import html
import json

_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:0}.route{border:1px solid #ccc;border-radius:6px;margin:1em 0;padding:.5em 1em}
.method{font-weight:bold;font-family:monospace;padding:.1em .4em;border-radius:3px;background:#e8eef8}
.path{font-family:monospace;font-weight:bold}code,pre{background:#f5f5f5;border-radius:3px}
pre{padding:.6em;overflow:auto;font-size:13px}td,th{text-align:left;padding:.2em .8em .2em 0;vertical-align:top}
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _schema_link(schema: dict) -> str:
    ref = schema.get("$ref", "")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        return f'<a href="#schema-{_e(name)}"><code>{_e(name)}</code></a>'
    return f"<code>{_e(json.dumps(schema))}</code>"


def _operation(path: str, method: str, op: dict) -> str:
    parts = [
        f'<div class="route" id="{_e(op.get("operationId", path))}">',
        f'<p><span class="method">{_e(method.upper())}</span> <span class="path">{_e(path)}</span> '
        f"&mdash; {_e(op.get('summary', ''))}{' (no API key needed)' if op.get('security') == [] else ''}</p>",
        f"<p>{_e(op.get('description', ''))}</p>",
    ]
    body = op.get("requestBody")
    if body:
        kinds = ", ".join(f"{_e(k)}: {_schema_link(v['schema'])}" for k, v in body["content"].items())
        parts.append(f"<p>Request body: {kinds}</p>")
    rows = []
    for status, answer in op.get("responses", {}).items():
        kinds = ", ".join(f"{_e(k)}: {_schema_link(v['schema'])}" for k, v in answer.get("content", {}).items())
        rows.append(f"<tr><td>{_e(status)}</td><td>{_e(answer.get('description', ''))}</td><td>{kinds}</td></tr>")
    parts.append("<table><tr><th>status</th><th>when</th><th>body</th></tr>" + "".join(rows) + "</table></div>")
    return "\n".join(parts)


def render(description: dict) -> str:
    """The page for an OpenAPI document."""
    info = description.get("info", {})
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(info.get('title', 'API'))}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(info.get('title', 'API'))}</h1><p>version {_e(info.get('version', ''))}</p>",
        f"<p>{_e(info.get('description', ''))}</p>",
        '<p>The machine-readable description: <a href="openapi.json"><code>openapi.json</code></a>.</p>',
        "<h2>Routes</h2>",
    ]
    for path, item in description.get("paths", {}).items():
        for method, op in item.items():
            out.append(_operation(path, method, op))
    out.append("<h2>Schemas</h2>")
    for name, schema in description.get("components", {}).get("schemas", {}).items():
        out.append(f'<h3 id="schema-{_e(name)}">{_e(name)}</h3><pre>{_e(json.dumps(schema, indent=2))}</pre>')
    out.append("</body></html>")
    return "\n".join(out)
