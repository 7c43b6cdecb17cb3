"""The KV transfer link's cost model (pure, no SimPy): a fixed latency per transfer plus the
payload over the link's bandwidth, with ``channels`` transfers in flight at once.

The defaults are an assumption, not a measurement: 25 GB/s is the line rate of a 200 Gb/s
network card (its payload rate is a little less), the class of link a PD deployment across hosts
uses; 50 µs stands for connection and completion-notification overhead. Within one host
(NVLink) the bandwidth is an order of magnitude higher or more; the lab takes both as parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.engines.models import ModelSpec
from workbench.errors import ConfigError


@dataclass(frozen=True, slots=True)
class LinkSpec:
    bandwidth_Bps: float = 25e9  # payload bytes per second of one channel
    latency_s: float = 50e-6  # per transfer: setup and completion notification
    channels: int = 1  # transfers in flight at once; more wait in the link's queue

    def __post_init__(self) -> None:
        if self.bandwidth_Bps <= 0 or self.latency_s < 0 or self.channels < 1:
            raise ConfigError(f"link {self}", "needs a positive bandwidth, a latency >= 0 and "
                              "at least one channel", "use e.g. LinkSpec(25e9, 50e-6, 1)")

    def transfer_s(self, nbytes: int) -> float:
        """Seconds one transfer of ``nbytes`` holds a channel."""
        return self.latency_s + nbytes / self.bandwidth_Bps


def handover_tokens(prompt_len: int) -> int:
    """Tokens whose KV the prefill side hands over: the whole prompt but its last token, which
    the decode side recomputes to sample the first output token (an engine schedules at least
    one token of a request, so a fully cached prompt still computes its tail)."""
    if prompt_len < 2:
        raise ConfigError(f"prompt of {prompt_len} tokens", "leaves nothing to hand over",
                          "use prompts of at least 2 tokens")
    return prompt_len - 1


def kv_bytes(model: ModelSpec, tokens: int) -> int:
    """Bytes of ``tokens`` tokens' KV across all layers (what the link carries)."""
    return tokens * model.kv_bytes_per_token
