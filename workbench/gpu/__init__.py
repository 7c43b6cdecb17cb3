"""``backend="gpu"``: the workbench core on real CUDA virtual memory (cuda-python + torch).

Importing this package imports neither torch nor cuda-python. Build a device with
``workbench.backends.make_device("gpu")`` (or ``"cuda:N"``), which says in one line why when it
cannot; :mod:`workbench.gpu.device` holds :class:`CudaDevice`, :mod:`workbench.gpu.tensors` the
CUDA side of the KV tensor views (needs torch).
"""

from __future__ import annotations
