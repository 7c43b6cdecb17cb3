"""An import-only stand-in for vLLM 0.26's CUDA op library (``vllm._C_stable_libtorch``), which
is too large to carry to the GPU machine.

vLLM imports the library unguarded and touches some ``torch.ops._C*`` ops while importing and
building layers. With ``custom_ops=["none"]``, native RMSNorm and the Triton attention backend,
no op of the library computes anything in a bf16 Llama forward pass, so each op here is only a
schema whose body raises (and is counted: a run reports ``CALLS`` to prove none ran). The
capability queries answer honestly: no CUTLASS kernels; the device's shared memory per block.

One op is real: ``_C.weak_ref_tensor``, which CUDA graph capture calls on every graph's output
(``enforce_eager=False``). vLLM's C++ op is ``from_blob(data_ptr, sizes, strides, options)``
with no deleter: a tensor over the same bytes whose storage owns nothing, so the graph's output
buffer is not kept alive by it. :func:`weak_ref_tensor` builds the same in torch: a storage
from the data pointer (torch's own non-owning constructor, the one its graph trees use) of
exactly the bytes the sizes and strides reach, set into a tensor at offset 0 with those sizes
and strides. What differs: it runs through the Python dispatcher (a few microseconds per call,
at capture only: replays never call it), and the tensor's storage has no allocator (as with
``from_blob``: neither can be resized).
"""

from __future__ import annotations

import sys

import torch

CALLS: dict[str, int] = {}
_LIBS: dict[str, torch.library.Library] = {}

# ops referenced (never run) while vLLM 0.26 imports and builds a Llama with the Triton backend
NAMES = {
    "_C": ["silu_and_mul", "rms_norm", "fused_add_rms_norm", "rotary_embedding",
           "get_cuda_view_from_cpu_tensor", "static_scaled_fp8_quant",
           "dynamic_scaled_fp8_quant", "dynamic_per_token_scaled_fp8_quant",
           "rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
           "rms_norm_dynamic_per_token_quant", "silu_and_mul_quant",
           "silu_and_mul_per_block_quant", "fused_qk_norm_rope"],
    "_C_cache_ops": ["reshape_and_cache_flash"],
}
CAPABILITIES = ["cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8",
                "cutlass_scaled_mm_supports_fp4", "cutlass_group_gemm_supported"]


def _lib(ns: str) -> torch.library.Library:
    if ns not in _LIBS:
        _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    return _LIBS[ns]


def _exists(ns: str, name: str) -> bool:
    try:
        return hasattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        return False


def _define(ns: str, schema: str, body) -> None:
    name = schema.split("(")[0]
    if _exists(ns, name):
        return
    key = f"{ns}.{name}"

    def counted(*args, **kwargs):
        CALLS[key] = CALLS.get(key, 0) + 1
        return body(*args, **kwargs)

    _lib(ns).define(schema)
    _lib(ns).impl(name, counted, "CompositeExplicitAutograd")


def _refuse(name: str):
    def body(*args, **kwargs):
        raise NotImplementedError(f"{name} needs vLLM's compiled op library, which this run "
                                  "does not carry")
    return body


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s bytes that does not keep them alive (see the module's text)."""
    if not t.is_cuda:
        raise RuntimeError("Tensor must be on CUDA device")  # as vLLM's op refuses
    reach = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    nbytes = reach * t.element_size() if t.numel() else 0
    storage = torch._C._construct_storage_from_data_pointer(t.data_ptr(), t.device, nbytes)
    empty = torch.empty(0, dtype=t.dtype, device=t.device)  # 0 bytes: no allocation
    return empty.set_(storage, 0, t.size(), t.stride())


def _shared_memory(device_id: int) -> int:
    props = torch.cuda.get_device_properties(device_id)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 232448)


def install(modname: str = "vllm._C_stable_libtorch") -> None:
    for ns, names in NAMES.items():
        for name in names:
            _define(ns, f"{name}(Tensor[] args) -> ()", _refuse(f"{ns}.{name}"))
    for name in CAPABILITIES:
        _define("_C", f"{name}(int cuda_device_capability) -> bool", lambda cap: False)
    _define("_C", "weak_ref_tensor(Tensor input) -> Tensor", weak_ref_tensor)
    _define("_C_cuda_utils", "get_max_shared_memory_per_block_device_attribute(int device_id) "
            "-> int", _shared_memory)
    sys.modules[modname] = sys.modules[__name__]
