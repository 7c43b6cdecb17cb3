"""A lab's result as one self-contained HTML page (``labs run NAME --html DIR``): the Markdown
report rendered, then every figure titled and drawn inline, plotly.js bundled once. The page
loads nothing from the network (the GPU machines have none), so it opens offline as it is."""

from __future__ import annotations

import html
from typing import Any

from workbench.viz.style import GRID, INK, PANEL

PAGE = "index.html"  # the one file --html DIR writes

# Kept short and neutral: the page is read in a browser beside the report's Markdown; its
# colours are the figures' palette (viz/style.py).
_CSS = f"""
body {{ font-family: Inter, Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: {INK}; line-height: 1.45; }}
table {{ border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }}
th, td {{ border: 1px solid {GRID}; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: {PANEL}; }}
code {{ background: {PANEL}; padding: 0 0.2em; }}
nav ul {{ columns: 2; }}
.wb-figure {{ margin: 1.5em 0; }}
"""


def _markdown_html(text: str) -> str:
    """The report's Markdown (pipe tables included) as HTML; raw HTML in it is escaped."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def figure_title(name: str, fig: Any) -> str:
    """A figure's heading: its own title, else what its axes measure (``TTFT (ms) against PEAK
    (req/s)``), else its name in words."""
    own = fig.layout.title.text if fig.layout.title else None
    if own:
        return own
    y, x = (fig.layout.yaxis.title.text, fig.layout.xaxis.title.text)
    if y and x:
        return f"{y} against {x}"
    return name.replace("_", " ")


def _figure_div(name: str, fig: Any) -> str:
    from workbench.viz.labfigs import styled

    fig = styled(fig, figure_title(name, fig))
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}",
                       config={"displaylogo": False, "responsive": True})
    return f"<section class='wb-figure' id='{html.escape(name)}'>{body}</section>"


def page_html(title: str, markdown: str, figures: dict[str, Any]) -> str:
    """The whole page: the report, a contents list of the figures, the figures."""
    from plotly.offline import get_plotlyjs

    names = list(figures)
    toc = "".join(f"<li><a href='#{html.escape(n)}'>{html.escape(figure_title(n, figures[n]))}"
                  "</a></li>" for n in names)
    nav = f"<nav><h2>Figures</h2><ul>{toc}</ul></nav>" if names else ""
    figs = "".join(_figure_div(n, figures[n]) for n in names)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            f"<main>{_markdown_html(markdown)}</main>{nav}{figs}</body></html>")
