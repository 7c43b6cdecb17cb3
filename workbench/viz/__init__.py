"""Live state plots fed by the event trace (plotly FigureWidget + ipywidgets; static fallback).

* :class:`Recording` — the event trace cut into steps (``trace``)
* :func:`page_map` — pages coloured by state or owner (``pagemap``)
* :func:`state_machine` — the VMM page state machine with a page highlighted (``statemachine``)
* :func:`block_table_figure` — block table / req_to_token / VMM pages of one request
* :func:`bytes_figure` — mapped and reserved bytes per pool over time (``timeline``)
* :func:`sequence_figure` — a transaction's messages between participants (``sequence``)
* :class:`Explorer` — all of it behind step / play / page / scenario controls (``explorer``)
"""

from __future__ import annotations

from workbench.viz.blocktable import block_table_figure, request_spans
from workbench.viz.explorer import Explorer, explore
from workbench.viz.live import figure, is_live, set_live
from workbench.viz.pagemap import page_map
from workbench.viz.sequence import Message, sequence_figure
from workbench.viz.statemachine import state_machine
from workbench.viz.timeline import bytes_figure
from workbench.viz.trace import Recording

__all__ = ["Explorer", "Message", "Recording", "block_table_figure", "bytes_figure", "explore",
           "figure", "is_live", "page_map", "request_spans", "sequence_figure", "set_live",
           "state_machine"]
