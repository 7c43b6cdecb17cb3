"""kvcached's published colocation figures (docs/sources.md#upstream-kvcached-colocation): the PEAK
values it swept and its TTFT table, which the colocation and control-groups labs show beside
theirs."""

from __future__ import annotations

PEAKS = (12, 13, 14, 15, 16, 17, 18, 19, 20)


# docs/sources.md#upstream-kvcached-colocation: read from the published SVG (bar heights
# approximate), ms.
KVCACHED = {
    "mean_elastic": dict(zip(PEAKS, (98, 106, 118, 129, 135, 211, 518, 1222, 2027), strict=True)),
    "mean_static": dict(zip(PEAKS, (94, 100, 111, 328, 839, 1599, 2379, 3165, 4026), strict=True)),
    "mean_speedup": dict(zip(PEAKS, (1.0, 0.9, 0.9, 2.5, 6.2, 7.6, 4.6, 2.6, 2.0), strict=True)),
    "p99_elastic": dict(zip(PEAKS, (211, 221, 260, 297, 322, 1555, 4548, 8877, 12310),
                            strict=True)),
    "p99_static": dict(zip(PEAKS, (194, 193, 243, 5184, 9086, 12159, 13489, 14610, 15267),
                           strict=True)),
    "p99_speedup": dict(zip(PEAKS, (0.9, 0.9, 0.9, 17.4, 28.2, 7.8, 3.0, 1.6, 1.2), strict=True)),
}
