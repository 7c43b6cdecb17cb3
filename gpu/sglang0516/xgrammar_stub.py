"""Import-only stand-in for ``xgrammar`` on the GPU machine (the real wheel is 45 MB and does
not fit a call beside the rest). SGLang 0.5.16's function-call and OpenAI-protocol modules import
``StructuralTag`` at start-up; the server runs with ``--grammar-backend none``, so no grammar is
ever compiled. Anything else asked of this module fails loudly."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StructuralTag(BaseModel):
    model_config = ConfigDict(extra="allow")


get_model_structural_tag = None


def __getattr__(name: str):
    raise ImportError(f"xgrammar.{name}: only an import stand-in is installed here "
                      "(structured output is off: --grammar-backend none)")
