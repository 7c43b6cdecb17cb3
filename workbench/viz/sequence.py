"""A transaction sequence diagram: participants as lifelines, messages as arrows down the time.

Input is a list of messages — :class:`Message`, or any object/dict/tuple with ``src``, ``dst``,
``label`` (and optionally ``t`` and ``ok``) — so a coordinator's message log, a hand-written
example or a replayed trace all draw the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import plotly.graph_objects as go

from workbench.core.messages import Reply
from workbench.viz.style import BAD, EDGE, FONT, NOTE, OK, PANEL, RULE, WHITE


class Message(NamedTuple):
    src: str
    dst: str
    label: str
    t: float | None = None
    ok: bool = True


def as_message(m: Any) -> Message:
    if isinstance(m, Message):
        return m
    if isinstance(m, dict):
        return Message(str(m["src"]), str(m["dst"]), str(m.get("label", m.get("kind", ""))),
                       m.get("t"), bool(m.get("ok", True)))
    if isinstance(m, tuple) and not hasattr(m, "_fields"):
        return Message(*m)
    return Message(str(m.src), str(m.dst), str(getattr(m, "label", getattr(m, "kind", ""))),
                   getattr(m, "t", None), bool(getattr(m, "ok", True)))


def _when(t: float) -> str:
    """A message's time: µs under a millisecond, ms above (no seven-digit µs on a lifeline)."""
    return f"{t * 1e6:.0f} µs" if abs(t) < 1e-3 else f"{t * 1e3:,.1f} ms"


def sequence_figure(messages: Iterable[Any], participants: Sequence[str] | None = None,
                    title: str = "Transaction sequence", upto: int | None = None) -> go.Figure:
    """Draw ``messages`` top to bottom in order; ``upto`` shows only the first N (a step slider).
    A message with ``ok=False`` (lost, refused, failed) is drawn red and dashed."""
    msgs = [as_message(m) for m in messages]
    names = list(participants or [])
    for m in msgs:
        for p in (m.src, m.dst):
            if p not in names:
                names.append(p)
    x = {p: i for i, p in enumerate(names)}
    n = len(msgs)
    shown = msgs if upto is None else msgs[:upto]
    fig = go.Figure()
    shapes = [dict(type="line", x0=i, x1=i, y0=0.3, y1=-(n + 0.5),
                   line=dict(color=RULE, width=1.5, dash="dot")) for i in range(len(names))]
    ann = [dict(x=i, y=0.6, text=f"<b>{p}</b>", showarrow=False, bgcolor=PANEL,
                bordercolor=EDGE, borderpad=4) for p, i in x.items()]
    for k, m in enumerate(shown, 1):
        color = OK if m.ok else BAD
        y = -k
        when = f" (t={_when(m.t)})" if isinstance(m.t, (int, float)) else ""
        if m.src == m.dst:  # a local step: a note on the lifeline
            ann.append(dict(x=x[m.src], y=y, text=m.label + when, showarrow=False,
                            bgcolor=NOTE, bordercolor=color, font=dict(size=10)))
            continue
        ann.append(dict(x=x[m.dst], y=y, ax=x[m.src], ay=y, xref="x", yref="y", axref="x",
                        ayref="y", showarrow=True, arrowhead=2, arrowwidth=1.6,
                        arrowcolor=color, text=""))
        ann.append(dict(x=(x[m.src] + x[m.dst]) / 2, y=y + 0.28, text=m.label + when,
                        showarrow=False, font=dict(size=10, color=color)))
    fig.add_trace(go.Scatter(x=[0, max(len(names) - 1, 1)], y=[0, -n], mode="markers",
                             marker=dict(opacity=0), hoverinfo="skip", showlegend=False))
    fig.update_layout(title=title, font=FONT, shapes=shapes, annotations=ann,
                      height=160 + 42 * max(n, 1), plot_bgcolor=WHITE,
                      margin=dict(l=20, r=20, t=60, b=20),
                      xaxis=dict(visible=False, range=[-0.7, len(names) - 0.3]),
                      yaxis=dict(visible=False, range=[-(n + 0.8), 1.0]))
    return fig


class RecordingTransport:
    """Wraps a coordinator transport and logs every request and reply as :class:`Message` s,
    so a real TP/PP transaction draws itself. A missing reply is logged as a failed message."""

    def __init__(self, inner: Any, name: str = "coordinator"):
        self.inner = inner
        self.name = name
        self.messages: list[Message] = []

    def now(self) -> float:
        return self.inner.now()

    def check(self, targets) -> None:
        self.inner.check(targets)

    def exchange(self, requests, timeout: float):
        t0 = self.inner.now()
        for t, msg in requests.items():
            self.messages.append(Message(self.name, str(t), _label(msg.to_json()), t0))
        replies = self.inner.exchange(requests, timeout)
        t1 = self.inner.now()
        for t, msg in requests.items():
            r = replies.get(t)
            if r is None:
                self.messages.append(Message(str(t), self.name, f"no reply to {msg.op}", t1,
                                             False))
            elif not isinstance(r, Reply):
                self.messages.append(Message(str(t), self.name, f"{msg.op}: malformed reply",
                                             t1, False))
            else:
                err = getattr(r.error_type, "value", r.error_type)
                status = r.state or (f"error ({err})" if err else r.status)
                self.messages.append(Message(str(t), self.name, f"{msg.op}: {status}", t1,
                                             r.is_ok))
        return replies

    def __getattr__(self, name: str):  # cluster helpers (states, crash, settle...) pass through
        return getattr(self.inner, name)


def _label(msg: dict) -> str:
    op = str(msg.get("op", "?")).upper()
    pages = msg.get("pages")
    tx = msg.get("txid")
    parts = [op]
    if pages:
        parts.append("page " + ",".join(map(str, pages)))
    if tx:
        parts.append(f"tx {str(tx)[:6]}")
    if msg.get("commit"):
        parts.append("+commit")
    return " ".join(parts)
