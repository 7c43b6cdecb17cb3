"""Benchmarks over the layers below (never imported by them).

* ``alloc``      allocator throughput on the simulated backend (``workbench bench alloc``)
* ``vmm``        grow/shrink vs raw cuMem* calls, map cost per layout, VMM bandwidth
  (``workbench bench vmm``; CUDA)
* ``difftrace``  random op traces replayed on two devices (the sim-vs-gpu differential test)
* ``transport``  TP worker processes over Unix sockets: map/unmap round trips
* ``mini``       the mini engine on a GPU: kernel check, decode throughput VMM vs static, steps
* ``ab``         interleaved VMM/static A/B rounds of the mini engine
* ``calibrate``  fit the step-time model to the mini engine's measured steps
* ``crossover``  host-tier retrieve vs recompute on the mini engine (``workbench bench crossover``)
"""
