"""SGLang 0.5.23's pools, allocators and radix cache on a CUDA GPU, stock or elastic.

``python gpu_scenario.py`` prints one ``RESULT {json}`` line: the radix flow and a K/V round trip
through ``set_kv_buffer`` (compared stock vs elastic by the test), and with
``WORKBENCH_KV_AUTOPATCH=1`` the elastic-only facts: pages map and unmap by the device's free
memory, misses are ``None``, a write to an unbacked slot does not fault, and a page freed while a
kernel may still touch it is unmapped only after that kernel finished.
``WORKBENCH_TEST_SGLANG_DEVICE`` picks the device (``cuda`` by default; ``cpu`` for a dry run).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("WORKBENCH_TEST_SGLANG_DEVICE", "cuda")
sys.path.insert(0, str(Path(__file__).parent))
t0 = time.time()
import scenario  # noqa: E402  (SGLang's imports, the device and the radix flow)
import torch  # noqa: E402

from workbench.adapters import boot, runtime  # noqa: E402

DEV = scenario.DEV


class Layer:  # what set_kv_buffer reads of SGLang's RadixAttention
    def __init__(self, layer_id: int):
        self.layer_id = layer_id


def device_free() -> int:
    if DEV == "cpu":
        return 0
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def kv_roundtrip(page_size: int) -> dict:
    """Write K/V through SGLang's set_kv_buffer, read them back through get_*_buffer."""
    kv, alloc = scenario.pool_and_alloc(page_size)
    loc = alloc.alloc(64 if page_size == 1 else 4 * page_size)
    gen = torch.Generator(device="cpu").manual_seed(7)
    k = torch.randn(loc.numel(), scenario.HEADS, scenario.DIM, generator=gen).half().to(DEV)
    v = torch.randn(loc.numel(), scenario.HEADS, scenario.DIM, generator=gen).half().to(DEV)
    kv.set_kv_buffer(Layer(1), loc, k, v)
    out = {"k_equal": bool(torch.equal(kv.get_key_buffer(1)[loc], k)),
           "v_equal": bool(torch.equal(kv.get_value_buffer(1)[loc], v)),
           "k_stride0": kv.k_buffer[0].stride(0), "device": str(kv.k_buffer[0].device)}
    alloc.free(loc)
    return out


def map_unmap(page_size: int) -> dict:
    kv, alloc = scenario.pool_and_alloc(page_size)
    led = kv.ledger
    warm = alloc.alloc(page_size)  # torch's caching allocator takes its blocks now, not below
    zero = getattr(led.device, "zero", None)
    held = (lambda: zero.held_bytes) if zero is not None else (lambda: 0)
    f = {"layout": led.geometry.layout.value, "page_id": led.geometry.page_id_bytes,
         "null_mapped": led.space.is_mapped(0), "mapped0": led.mapped_bytes}
    base, zero0 = device_free(), held()
    ids = alloc.alloc(4096)  # 4096 slots x 2 KiB x 2 layers x K,V: 4 more page ids
    f["mapped_up"], f["free_drop"] = led.mapped_bytes, base - device_free()
    f["zero_up"] = held() - zero0
    alloc.free(ids)
    torch.cuda.synchronize() if DEV != "cpu" else None
    alloc.available_size()  # releases what the fence has seen finish
    f["mapped_down"], f["free_back"] = led.mapped_bytes, base - device_free()
    f["zero_down"] = held() - zero0  # a zero piece of a new size is made once, then shared
    led.set_limit(2 * led.geometry.page_id_bytes)  # every path misses with None now
    f["alloc_miss"] = alloc.alloc(scenario.SIZE // 2) is None
    if page_size > 1:
        z = torch.zeros(4, dtype=torch.int64, device=DEV)
        seq = torch.full((4,), 1024, dtype=torch.int64, device=DEV)
        f["alloc_extend_miss"] = alloc.alloc_extend(z, z.cpu(), seq, seq.cpu(), z - 1,
                                                    4096) is None
    alloc.free(warm)
    return f


def unbacked_write(page_size: int) -> dict:
    """Warm-up and padded writes may hit slots whose page is not backed: no fault."""
    kv, alloc = scenario.pool_and_alloc(page_size)
    led = kv.ledger
    far = scenario.SIZE - 8  # a slot on the last page id, never allocated here
    page = led.geometry.block_page(led.geometry.slot_block(far))
    loc = torch.arange(far, far + 8, device=DEV)
    ones = torch.ones(8, scenario.HEADS, scenario.DIM, dtype=torch.float16, device=DEV)
    kv.set_kv_buffer(Layer(0), loc, ones, ones)
    torch.cuda.synchronize() if DEV != "cpu" else None
    return {"page_mapped": led.space.is_mapped(page), "no_fault": True,
            "zero_access": getattr(led.device, "zero_access", None)}


def fence_order() -> dict:
    """Free a page while a queued kernel will still write it: it stays mapped until then."""
    kv, alloc = scenario.pool_and_alloc(1)
    led = kv.ledger
    bpp = led.geometry.page_size // led.geometry.block_bytes
    alloc.alloc(bpp - 1)  # the rest of page id 0 (the null block's page, mapped for good)
    ids = alloc.alloc(bpp)  # exactly page id 1
    page = led.geometry.block_page(int(ids[0]))
    assert {led.geometry.block_page(int(i)) for i in ids.tolist()} == {page}
    vals = torch.full((ids.numel(), scenario.HEADS, scenario.DIM), 3.0, dtype=torch.float16,
                      device=DEV)
    # The write runs on a side stream, as SGLang's overlap scheduler runs the forward pass on
    # the model runner's stream (autopatch registers that one; this test registers its own).
    # A free on the current stream syncs only that stream (``.tolist()``), not the side one.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    runtime.watch_stream(side)
    with torch.cuda.stream(side):
        torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU time queued before the write
        kv.set_kv_buffer(Layer(0), ids, vals, vals)
    alloc.free(ids)  # the CPU frees now; the GPU has not written yet
    f = {"state_after_free": led.pages.state[page].value, "mapped_after_free":
         led.space.is_mapped(page), "pending": len(led.fence.pending)}
    alloc.available_size()  # polls: the kernel is still running, nothing may be released
    f["mapped_while_running"] = led.space.is_mapped(page)
    torch.cuda.synchronize()
    alloc.available_size()
    f["state_after_sync"] = led.pages.state[page].value
    f["mapped_after_sync"] = led.space.is_mapped(page)
    return f


def main() -> None:
    result = {"import_s": round(time.time() - t0, 1), "device": DEV,
              "patches": boot.status(),
              "flows": {str(ps): scenario.radix_flow(ps) for ps in (1, 16)},
              "roundtrip": {str(ps): kv_roundtrip(ps) for ps in (1, 16)}}
    if any(r["status"] == "applied" for r in result["patches"]):
        result["map_unmap"] = {str(ps): map_unmap(ps) for ps in (1, 16)}
        if DEV != "cpu":  # the host device's zero page is read-only: a write there faults
            result["unbacked"] = {str(ps): unbacked_write(ps) for ps in (1, 16)}
            result["fence"] = fence_order()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
