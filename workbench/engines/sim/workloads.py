"""Workloads (seed 000 §14.3, seed 003 §3, §6; kvcached §6.1). Every generator is seeded: the same
arguments give the same requests (arrival times and token ids).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from workbench.engines.sched.request import Request
from workbench.errors import ConfigError

VOCAB = 128_000


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1, VOCAB, size=n).tolist()


def poisson(rate: float, num_requests: int, *, prompt_len: int = 256, output_len: int = 256,
            seed: int = 0, start: float = 0.0, group: str = "", rid0: int = 0) -> list[Request]:
    """Open-loop Poisson arrivals at ``rate`` req/s with random prompts."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=num_requests)
    times = start + np.cumsum(gaps)
    return [Request(rid0 + i, _tokens(rng, prompt_len), output_len, float(t), group)
            for i, t in enumerate(times)]


# -- kvcached's ramp-up-down trace -----------------------------------------------------------------
def ramp_delay(peak: int) -> float:
    """Start offset between consecutive models: PEAK/4 + 2*PEAK seconds."""
    return peak / 4 + 2 * peak


def ramp_arrivals(peak: int, model_index: int, num_models: int = 3) -> list[float]:
    """Arrival times of model ``i``: 0 -> PEAK req/s over PEAK s (+1 req/s per second, evenly
    spaced in each second), back down to 1 req/s over PEAK-1 s (PEAK^2 requests), then a
    1 req/s tail of (num_models-1-i+1)*delay = (3-i)*delay requests; starts at i*delay."""
    delay = ramp_delay(peak)
    t0 = model_index * delay
    rates = list(range(1, peak + 1)) + list(range(peak - 1, 0, -1))
    out: list[float] = []
    for sec, rate in enumerate(rates):
        out.extend(t0 + sec + k / rate for k in range(rate))
    tail_start = t0 + len(rates)
    n_tail = int(round((num_models - model_index) * delay))
    out.extend(tail_start + k for k in range(n_tail))
    return out


def ramp_trace(peak: int, model_index: int, *, num_models: int = 3, prompt_len: int = 256,
               output_len: int = 256, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng([seed, peak, model_index])
    return [Request(i, _tokens(rng, prompt_len), output_len, t, f"model{model_index}")
            for i, t in enumerate(ramp_arrivals(peak, model_index, num_models))]


# -- kvcached's ramp as its own script sends it (docs/sources.md#upstream-kvcached-setting) -----
RAMP_TAILS = ("script", "as_run")  # model i's 1 req/s tail: (N-i)*delay, or cumulative (as run)


def kvcached_ramp_delay(peak: int) -> int:
    """Seconds between two models' starts in kvcached's script: PEAK//4 + 2*PEAK (the shell's
    integer arithmetic, so PEAK 13 gives 29, not 29.25)."""
    return peak // 4 + 2 * peak


def kvcached_ramp_rates(peak: int) -> list[int]:
    """Requests in each second of the ramp: +1 req/s per second from 0 to PEAK, then -1 req/s per
    second down to 1 (each phase at least one second long, as the client's schedule has it)."""
    up = [min(s + 1, peak) for s in range(max(1, peak))]
    return up + [max(peak - (s + 1), 1) for s in range(max(1, peak - 1))]


def kvcached_ramp_counts(peak: int, num_models: int, tails: str = "script") -> list[int]:
    """Requests per model: PEAK^2 on the ramp plus its 1 req/s tail. ``script``: model i's tail
    is (N-i)*delay, what the script sends now; ``as_run``: each model's count adds to the one
    before (model i gets PEAK^2 + sum over j<=i of (N-j)*delay), the script's arithmetic when
    kvcached's published figures were made."""
    d, base, out, extra = kvcached_ramp_delay(peak), peak * peak, [], 0
    for i in range(num_models):
        extra = (extra if tails == "as_run" else 0) + (num_models - i) * d
        out.append(base + extra)
    return out


def kvcached_ramp_arrivals(peak: int, model_index: int, num_models: int = 3,
                           tails: str = "script") -> list[float]:
    """Arrival times (s) of model ``model_index``: it starts at i*delay; in second s of the ramp
    its requests are evenly spaced; once the ramp is sent, the rest follow one a second, the
    first one second after the ramp's last request. No time scaling."""
    _check_ramp(peak, model_index, num_models, tails)
    n = kvcached_ramp_counts(peak, num_models, tails)[model_index]
    t0 = model_index * kvcached_ramp_delay(peak)
    out: list[float] = []
    for sec, rate in enumerate(kvcached_ramp_rates(peak)):
        out.extend(t0 + sec + k / rate for k in range(rate))
    out = out[:n]
    last = out[-1]
    return out + [last + k for k in range(1, n - len(out) + 1)]


def kvcached_ramp_traces(peak: int, num_models: int = 3, *, prompt_len: int = 256,
                         output_len: int = 256, seed: int = 0,
                         tails: str = "script") -> list[list[Request]]:
    """kvcached's colocation trace at ``peak``: per model its ramp, prompts of ``prompt_len``
    random token ids (drawn from ``seed``, the PEAK and the model), ``output_len`` tokens each;
    the group names the model."""
    out = []
    for i in range(num_models):
        times = kvcached_ramp_arrivals(peak, i, num_models, tails)
        rng = np.random.default_rng([seed, peak, i, prompt_len])
        out.append([Request(k, _tokens(rng, prompt_len), output_len, t, f"model{i}")
                    for k, t in enumerate(times)])
    return out


def _check_ramp(peak: int, model_index: int, num_models: int, tails: str) -> None:
    if not isinstance(peak, int) or isinstance(peak, bool) or peak < 1:
        raise ConfigError(f"PEAK {peak!r}", "kvcached's ramp climbs by 1 req/s per second",
                          "give a whole number of req/s, 1 or more")
    if num_models < 1 or not 0 <= model_index < num_models:
        raise ConfigError(f"model {model_index} of {num_models}", "is not one of the models",
                          "give 0 <= model_index < num_models")
    if tails not in RAMP_TAILS:
        raise ConfigError(f"tails {tails!r}", "is not a tail rule of kvcached's script",
                          f"use one of {', '.join(RAMP_TAILS)}")


# -- prefix groups A-D (seed 003 §6) ---------------------------------------------------------------
class PrefixCase(NamedTuple):
    group: str
    request: Request
    expected_hit_tokens: int  # against a cache warmed by the base document prompt


def prefix_groups(*, doc_len: int = 1024, suffix_len: int = 64, per_group: int = 4,
                  block_size: int = 16, early_pos: int = 5, late_back: int = 8,
                  preamble_len: int = 32, output_len: int = 16, seed: int = 0,
                  gap_s: float = 0.05) -> tuple[Request, list[PrefixCase]]:
    """A warm-up request ``doc + q0`` and four groups of probes after it:

    * **A** same document, different question: hits the whole document (block-aligned);
    * **B** a token early in the document changed: every block after it changes identity;
    * **C** a token near the end changed: reuse depth stops at that token's block;
    * **D** the same document after a different preamble: a plain prefix cache reuses nothing.

    ``expected_hit_tokens`` assumes block-aligned reuse of ``block_size`` and that the probe itself
    keeps at least one token to compute.
    """
    rng = np.random.default_rng(seed)
    doc = _tokens(rng, doc_len)
    warm = Request(0, doc + _tokens(rng, suffix_len), output_len, 0.0, "warm")
    aligned = lambda n: n - n % block_size  # noqa: E731
    cases: list[PrefixCase] = []
    rid, t = 1, gap_s
    for g in "ABCD":
        for k in range(per_group):
            q = _tokens(rng, suffix_len)
            if g == "A":
                prompt, hit = doc + q, aligned(doc_len)
            elif g == "B":
                d = list(doc)
                d[early_pos] = (d[early_pos] + 1 + k) % VOCAB or 1  # each probe its own edit
                prompt, hit = d + q, aligned(early_pos)
            elif g == "C":
                pos = doc_len - late_back
                d = list(doc)
                d[pos] = (d[pos] + 1 + k) % VOCAB or 1
                prompt, hit = d + q, aligned(pos)
            else:
                prompt, hit = _tokens(rng, preamble_len) + doc + q, 0
            cases.append(PrefixCase(g, Request(rid, prompt, output_len, t, g), hit))
            rid += 1
            t += gap_s
    return warm, cases


# -- long/short mixes (seed 003 §3) ----------------------------------------------------------------
MIX_CLASSES: dict[str, tuple[int, int]] = {
    "short": (128, 128),  # launch, CPU, interactive latency
    "long_in": (4096, 128),  # prefill, TTFT, cache value
    "long_out": (128, 1024),  # decode, ITL, KV growth
}


def long_short_mix(rate: float, num_requests: int, *, weights: dict[str, float] | None = None,
                   seed: int = 0) -> list[Request]:
    """Poisson arrivals whose (input, output) lengths are drawn from :data:`MIX_CLASSES` in a
    fixed ratio (default equal); the class name is the request's ``group``."""
    weights = weights or {k: 1.0 for k in MIX_CLASSES}
    names = sorted(weights)
    p = np.array([weights[k] for k in names], dtype=float)
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=num_requests))
    kinds = rng.choice(len(names), size=num_requests, p=p / p.sum())
    out = []
    for i, (t, k) in enumerate(zip(times, kinds, strict=False)):
        inp, outp = MIX_CLASSES[names[k]]
        out.append(Request(i, _tokens(rng, inp), outp, float(t), names[k]))
    return out


# -- prefix-heavy traffic (kvcached's bench_idle_footprint shape) ---------------------------------
def prefix_heavy(num_requests: int, *, rate: float = 32.0, num_prefixes: int = 32,
                 prefix_len: tuple[int, int] = (256, 1024), suffix_len: tuple[int, int] = (32, 128),
                 output_len: tuple[int, int] = (16, 256), zipf_a: float = 1.2,
                 seed: int = 0) -> list[Request]:
    """Poisson arrivals; each prompt = one of ``num_prefixes`` shared prefixes (Zipf popularity)
    + a unique suffix; outputs uniform in ``output_len`` (kvcached's bench used 16-256)."""
    rng = np.random.default_rng(seed)
    prefixes = [_tokens(rng, int(rng.integers(prefix_len[0], prefix_len[1] + 1)))
                for _ in range(num_prefixes)]
    w = 1.0 / np.arange(1, num_prefixes + 1) ** zipf_a
    times = np.cumsum(rng.exponential(1.0 / rate, size=num_requests))
    picks = rng.choice(num_prefixes, size=num_requests, p=w / w.sum())
    out = []
    for i, (t, k) in enumerate(zip(times, picks, strict=False)):
        suffix = _tokens(rng, int(rng.integers(suffix_len[0], suffix_len[1] + 1)))
        n_out = int(rng.integers(output_len[0], output_len[1] + 1))
        out.append(Request(i, prefixes[k] + suffix, n_out, float(t), f"p{k}"))
    return out


# -- traffic phases (seed 000 §6-§8: idle -> short -> long -> idle -> repeat) ----------------------
class Phase(NamedTuple):
    """A window of Poisson traffic; ``rate`` 0 is an idle window. Phases with the same
    ``prompt_key`` (and rate and duration) send the same requests at the same offsets from their
    start: a repeat of earlier traffic."""

    name: str
    duration_s: float
    rate: float = 0.0
    prompt_len: int = 128
    output_len: int = 128
    prompt_key: int | None = None  # None: fresh prompts


class PhaseWindow(NamedTuple):
    name: str
    start: float
    end: float
    requests: int


def phased(phases: list[Phase], *, seed: int = 0, group_prefix: str = "",
           rid0: int = 0) -> tuple[list[Request], list[PhaseWindow]]:
    """Back-to-back phases from t = 0: the requests (``group`` = prefix + phase name) and each
    phase's window. Arrivals are drawn per phase and cut at its end."""
    out: list[Request] = []
    windows: list[PhaseWindow] = []
    t0 = 0.0
    for i, ph in enumerate(phases):
        n0 = len(out)
        if ph.rate > 0:
            key = ph.prompt_key if ph.prompt_key is not None else 1_000_000 + i
            gaps = np.random.default_rng([seed, key, 0]).exponential(
                1.0 / ph.rate, size=int(ph.rate * ph.duration_s * 3) + 8)
            times = t0 + np.cumsum(gaps)
            rng = np.random.default_rng([seed, key, 1])
            for t in times[times < t0 + ph.duration_s]:
                out.append(Request(rid0 + len(out), _tokens(rng, ph.prompt_len), ph.output_len,
                                   float(t), group_prefix + ph.name))
        windows.append(PhaseWindow(ph.name, t0, t0 + ph.duration_s, len(out) - n0))
        t0 += ph.duration_s
    return out, windows
