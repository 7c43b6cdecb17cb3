"""A lab's result in a notebook: its figures titled and styled like the chapters', its tables
as short HTML tables, and a panel that re-runs the lab with new parameters.

Only :class:`~workbench.labs.base.LabResult` is read (``figures``, ``tables``, ``record``), so the
lab packages' internals may move without touching the notebooks.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from workbench.viz.controls import sliders
from workbench.viz.live import figure, is_live
from workbench.viz.style import FONT, WHITE, themed


def styled(fig, title: str | None = None):
    """``fig`` with a title (``title``, else its own) and the chapters' theme, font and
    background."""
    themed(fig)
    own = fig.layout.title.text if fig.layout.title else None
    fig.update_layout(title=title or own, font=FONT)
    if fig.layout.plot_bgcolor is None:  # a lab figure's own layout (margins, colours) stays
        fig.update_layout(plot_bgcolor=WHITE)
    if fig.layout.margin.t is None:
        fig.update_layout(margin=dict(t=60))
    return fig


def show_figures(result: Any, titles: Mapping[str, str] | None = None,
                 only: Iterable[str] | None = None) -> list:
    """Display each of ``result.figures`` (or those named in ``only``) with a title: the one in
    ``titles``, else the figure's own, else its name. Returns the figures shown."""
    from IPython.display import display

    titles = dict(titles or {})
    names = list(only) if only is not None else list(result.figures)
    shown = []
    for name in names:
        fig = styled(result.figures[name], titles.get(name))
        if not fig.layout.title.text:
            fig.update_layout(title=name.replace("_", " "))
        shown.append(figure(fig))
        display(shown[-1])
    return shown


def cell(v: Any) -> str:
    """One value as a report cell reads it: ``-`` for nothing, yes/no, a mapping as
    ``key: value, ...``, a list comma-separated, a float to three figures (thousands whole)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}: {cell(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(cell(x) for x in v)
    return str(v)


def table_html(rows: list[Mapping[str, Any]], columns: Iterable[str] | None = None,
               title: str = "", limit: int = 12) -> str:
    """The first ``limit`` rows as an HTML table with a heading (nested values inlined)."""
    rows = list(rows)
    cols = list(columns) if columns is not None else list(rows[0]) if rows else []
    head = "".join(f"<th>{html.escape(c.replace('_', ' '))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(r.get(c, '')))}</td>"
                                    for c in cols) + "</tr>" for r in rows[:limit])
    more = f"<p><i>{len(rows) - limit} more rows in the report above.</i></p>" \
        if len(rows) > limit else ""
    return (f"<h4>{html.escape(title)}</h4><table class='wb-lab-table'><thead><tr>{head}</tr>"
            f"</thead><tbody>{body}</tbody></table>{more}")


def show_table(rows: list[Mapping[str, Any]], columns: Iterable[str] | None = None,
               title: str = "", limit: int = 12) -> None:
    from IPython.display import HTML, display

    display(HTML(table_html(rows, columns, title, limit)))


def verdict_line(result: Any) -> str:
    """The record's own verdict, as the notebook quotes it (never restated by hand)."""
    return f"**Verdict (from the record):** {result.record.verdict}"


def _dropdowns(spec: Mapping[str, list]) -> dict[str, Any]:
    """A list of choices becomes a Dropdown (first choice selected) when live, else its first."""
    if not is_live():
        return {k: v[0] for k, v in spec.items()}
    import ipywidgets as w

    return {k: w.Dropdown(options=[(str(x), x) for x in v], value=v[0],
                          description=k.replace("_", " "), style={"description_width": "initial"})
            for k, v in spec.items()}


class RerunPanel:
    """Sliders for a lab's main parameters and a Run button: a click runs ``run(**values)``
    (which returns a LabResult) and redraws its figures below. Static mode shows nothing."""

    def __init__(self, run: Callable[..., Any], titles: Mapping[str, str] | None = None,
                 only: Iterable[str] | None = None, **spec: Any):
        self.run, self.titles, self.only = run, titles, only
        lists = {k: v for k, v in spec.items() if isinstance(v, list)}
        self.controls = sliders(**{k: v for k, v in spec.items() if k not in lists})
        self.controls.update(_dropdowns(lists))
        self.result = None
        self.box = None
        if is_live():
            self._build()

    def values(self) -> dict[str, Any]:
        return {k: getattr(w, "value", w) for k, w in self.controls.items()}

    def _build(self) -> None:
        import ipywidgets as w

        self.button = w.Button(description="Run the lab", button_style="primary")
        self.status = w.HTML("<i>Move a slider, then press Run.</i>")
        self.out = w.Output()
        self.button.on_click(lambda _b: self.rerun())
        widgets = [c for c in self.controls.values() if hasattr(c, "observe")]
        self.box = w.VBox([w.HBox(widgets), w.HBox([self.button, self.status]), self.out])
        self.box.add_class("wb-lab-rerun")

    def rerun(self):
        """Run once with the sliders' values; returns the LabResult (tests call this)."""
        self.result = self.run(**self.values())
        if self.box is not None:
            from IPython.display import Markdown, display

            self.status.value = html.escape(f"record: {self.result.record.verdict}")
            self.out.clear_output()
            with self.out:
                display(Markdown(verdict_line(self.result)))
                show_figures(self.result, self.titles, self.only)
        return self.result

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.box is not None:
            display(self.box)
        else:
            print("(static output: set the parameters cell and re-run the notebook)")


def compare_figure(categories: list[str], series: Mapping[str, list[float]], *, title: str,
                   yaxis_title: str = "", log: bool = False):
    """Grouped bars, one group per category and one bar per series (ours beside a published
    reference, say), titled and styled like the lab figures."""
    import plotly.graph_objects as go

    fig = go.Figure([go.Bar(name=name, x=categories, y=ys) for name, ys in series.items()])
    fig.update_layout(barmode="group", yaxis_title=yaxis_title, height=360,
                      yaxis_type="log" if log else "linear")
    return figure(styled(fig, title))
