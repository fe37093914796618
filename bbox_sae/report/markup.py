"""HTML built from elements, never from string pasting: every text is escaped on the way in.

Corpus text, labels and model names are untrusted; `el` escapes each child that is not
already `Markup` and each attribute value, so a caller cannot forget to. `for_script` is the
one way data enters a `<script>` element.
"""

from __future__ import annotations

import html
import json
import math


class Markup(str):
    """HTML that is already safe: the output of `el`, or a join of such outputs."""


def _safe(child) -> str:
    return child if isinstance(child, Markup) else html.escape(str(child))


def join(parts) -> Markup:
    return Markup("".join(_safe(p) for p in parts))


def el(tag: str, *children, **attrs) -> Markup:
    """`<tag attrs>children</tag>`. Attribute names: `cls` is `class`, `_` becomes `-`;
    None and False leave an attribute out, True writes it bare (`open`, `hidden`)."""
    parts = [tag]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        name = "class" if name == "cls" else name.replace("_", "-")
        parts.append(name if value is True else f'{name}="{html.escape(str(value))}"')
    inner = "".join(_safe(c) for c in children if c is not None)
    return Markup(f"<{' '.join(parts)}>{inner}</{tag}>")


def num(x, digits: int | None = None) -> float | None:
    """JSON-safe float: NaN and ±inf become None (JSON has no NaN, and W&B tables choke on it);
    `digits` rounds, for numbers shown at a few significant places where full precision is bytes."""
    if x is None or isinstance(x, bool):
        return x
    x = float(x)
    if not math.isfinite(x):
        return None
    return x if digits is None else round(x, digits)


def fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def for_script(obj) -> Markup:
    """JSON that cannot end its <script> element: `<`, `>`, `&` become \\u escapes."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
