"""The live explorer: page map + state machine + bytes chart driven by ipywidgets controls.

Controls: a step slider with a play button (scrub the recording), a pool/page picker (or click a
cell of the page map) for the state-machine highlight, a colour toggle (state / owner), and any
scenario sliders you pass (load, limit...): moving one re-runs the scenario and redraws.
Static mode (see :mod:`workbench.viz.live`) shows the same figures at the last step instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from workbench.viz.live import figure, is_live
from workbench.viz.pagemap import page_map, update_page_map
from workbench.viz.statemachine import state_machine, update_state_machine
from workbench.viz.timeline import bytes_figure, move_cursor
from workbench.viz.trace import Recording


def _rec(result: Any) -> Recording:
    return result if isinstance(result, Recording) else result.rec


def default_summary(result: Any) -> str:
    rec = _rec(result)
    parts = [f"{len(rec.steps)} steps, {len(rec.events)} page events"]
    for key in ("finished", "misses"):
        d = getattr(result, key, None)
        if d:
            parts.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in d.items()))
    for r in getattr(result, "limit_results", []) or []:
        parts.append(f"limit → {r.outcome.value} ({r.target_pages} pages)")
    return " · ".join(parts)


def busiest_page(rec: Recording) -> tuple[str, int]:
    """The (pool, page) with the most transitions: the most instructive one to follow."""
    c = Counter((e.pool, e.page) for e in rec.events if e.page > 0 and e.src != e.dst)
    if not c:
        return next(iter(rec.pools)), 0
    return c.most_common(1)[0][0]


class Explorer:
    def __init__(self, run: Callable[..., Any], controls: dict[str, Any] | None = None, *,
                 width: int = 24, capacity: int | None = None,
                 summary: Callable[[Any], str] = default_summary, live: bool | None = None,
                 extra: tuple[Callable[[Any, int | None], Any],
                              Callable[[Any, Any, int | None], None]] | None = None):
        """``extra``: (make_figure(result, step), update_figure(fig, result, step)) for one more
        figure that follows the step slider (e.g. prefix ownership per page)."""
        self.run, self.width, self.capacity, self.summary_fn = run, width, capacity, summary
        self.extra = extra
        self.controls = dict(controls or {})
        self.live = is_live() if live is None else live
        self.result = run(**self._values())
        self.rec = _rec(self.result)
        self.pool, self.page = busiest_page(self.rec)
        self.color_by = "state"
        self.step = len(self.rec.steps) - 1
        if self.live:
            self._build_widgets()

    # -- helpers -----------------------------------------------------------------------------
    def _values(self) -> dict[str, Any]:
        return {k: getattr(w, "value", w) for k, w in self.controls.items()}

    def _machine_args(self):
        st = self.rec.states_at(self.step)[self.pool][self.page]
        last = self.rec.last_event(self.pool, self.page, self.step)
        return st, last, f"VMM state machine — {self.pool} page {self.page}"

    def figures(self) -> dict[str, Any]:
        """Plain figures at the current step (static output, tests)."""
        st, last, title = self._machine_args()
        return {"page_map": page_map(self.rec, self.step, width=self.width,
                                     color_by=self.color_by),
                "state_machine": state_machine(st, last, title),
                "bytes": bytes_figure(self.rec, self.step, capacity=self.capacity),
                **({"extra": self.extra[0](self.result, self.step)} if self.extra else {})}

    # -- live widgets ------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        import ipywidgets as w

        figs = self.figures()
        self.fig_map = figure(figs["page_map"], live=True)
        self.fig_machine = figure(figs["state_machine"], live=True)
        self.fig_bytes = figure(figs["bytes"], live=True)
        self.fig_extra = figure(figs["extra"], live=True) if self.extra else None
        n = len(self.rec.steps)
        self.step_slider = w.IntSlider(value=self.step, min=0, max=n - 1, description="step",
                                       continuous_update=True, layout=w.Layout(width="60%"))
        self.play = w.Play(value=self.step, min=0, max=n - 1, interval=350, description="play")
        w.jslink((self.play, "value"), (self.step_slider, "value"))
        self.pool_dd = w.Dropdown(options=list(self.rec.pools), value=self.pool,
                                  description="pool", layout=w.Layout(width="180px"))
        self.page_slider = w.IntSlider(value=self.page, min=0,
                                       max=self.rec.pools[self.pool].num_pages - 1,
                                       description="page")
        self.color_tb = w.ToggleButtons(options=["state", "owner"], value="state",
                                        description="colour by")
        self.label = w.HTML(self._status())
        self.step_slider.observe(lambda c: self.set_step(c["new"]), names="value")
        self.pool_dd.observe(lambda c: self.choose(c["new"], 0), names="value")
        self.page_slider.observe(lambda c: self.choose(self.pool, c["new"]), names="value")
        self.color_tb.observe(lambda c: self.set_color(c["new"]), names="value")
        for ctl in self.controls.values():
            if hasattr(ctl, "observe"):
                ctl.continuous_update = False
                ctl.observe(lambda _c: self.rerun(), names="value")
        self.fig_map.data[0].on_click(self._clicked)
        scenario = [c for c in self.controls.values() if hasattr(c, "observe")]
        self.box = w.VBox([
            w.HBox(scenario) if scenario else w.HTML(""),
            w.HBox([self.play, self.step_slider]), self.label,
            w.HBox([self.color_tb]), self.fig_map,
            w.HBox([self.pool_dd, self.page_slider]), self.fig_machine, self.fig_bytes]
            + ([self.fig_extra] if self.fig_extra is not None else []))
        self.box.add_class("wb-explorer")

    def _status(self) -> str:
        s = self.rec.steps[self.step].label if self.rec.steps else ""
        return f"<b>{s}</b><br><small>{self.summary_fn(self.result)}</small>"

    def _clicked(self, trace, points, _state) -> None:
        """A click on a page-map cell picks that page for the state machine."""
        if not points.xs or not points.ys:
            return
        col, row = int(points.xs[0]), int(points.ys[0])
        text = trace.text[row][col] if trace.text else ""
        if " · page " in text:
            pool, rest = text.split(" · page ")
            self.pool_dd.value = pool
            self.page_slider.value = int(rest.split(" · ")[0])

    # -- actions (also callable from code) ---------------------------------------------------
    def set_step(self, step: int) -> None:
        self.step = max(0, min(step, len(self.rec.steps) - 1))
        if not self.live:
            return
        update_page_map(self.fig_map, self.rec, self.step, width=self.width,
                        color_by=self.color_by)
        update_state_machine(self.fig_machine, *self._machine_args())
        move_cursor(self.fig_bytes, self.step)
        if self.extra:
            self.extra[1](self.fig_extra, self.result, self.step)
        self.label.value = self._status()

    def choose(self, pool: str, page: int) -> None:
        self.pool, self.page = pool, min(page, self.rec.pools[pool].num_pages - 1)
        if self.live:
            self.page_slider.max = self.rec.pools[pool].num_pages - 1
            update_state_machine(self.fig_machine, *self._machine_args())

    def set_color(self, color_by: str) -> None:
        self.color_by = color_by
        if self.live:
            self._replace(self.fig_map, page_map(self.rec, self.step, width=self.width,
                                                 color_by=color_by))

    def rerun(self, **values) -> None:
        """Run the scenario again with the controls' values (plus ``values``) and redraw."""
        for k, v in values.items():
            if hasattr(self.controls.get(k), "value"):
                self.controls[k].value = v  # fires the observer when live
            else:
                self.controls[k] = v
        self.result = self.run(**self._values())
        self.rec = _rec(self.result)
        if self.pool not in self.rec.pools:
            self.pool, self.page = busiest_page(self.rec)
        self.step = len(self.rec.steps) - 1
        if not self.live:
            return
        n = len(self.rec.steps)
        self.play.max = self.step_slider.max = n - 1
        self.step_slider.value = self.step
        figs = self.figures()
        pairs = [(self.fig_map, figs["page_map"]), (self.fig_bytes, figs["bytes"]),
                 (self.fig_machine, figs["state_machine"])]
        if self.extra:
            pairs.append((self.fig_extra, figs["extra"]))
        for widget, fig in pairs:
            self._replace(widget, fig)
        self.label.value = self._status()

    @staticmethod
    def _replace(widget, fig) -> None:
        with widget.batch_update():
            widget.data = []
            widget.add_traces(list(fig.data))
            widget.layout = fig.layout

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.live:
            display(self.box)
            return
        print(self.summary_fn(self.result))
        for fig in self.figures().values():
            display(figure(fig, live=False))


def explore(run: Callable[..., Any], controls: dict[str, Any] | None = None, **kw) -> Explorer:
    """Build an :class:`Explorer` (display it by leaving it last in a cell)."""
    return Explorer(run, controls, **kw)
