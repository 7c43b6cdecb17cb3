"""The simulated part of the engines: SimPy driver, step-time model, workloads, clusters.

* ``steptime``    roofline step-time model per GPU preset
* ``driver``      the SimPy step loop that runs any scheduler against simulated time
* ``kvsetup``     an instance's KV memory: a static split or an elastic pool on a SimDevice
* ``engine``      :class:`SimEngine`, the :class:`~workbench.engines.base.Engine` protocol
  over a scheduler and its driver
* ``vllm_like`` / ``sglang_like``  the two simulated engine kinds
* ``cluster``     several instances (of one kind or mixed) on one simulated GPU
* ``workloads``   Poisson, kvcached's ramp trace, prefix groups A-D, long/short mixes
"""
