"""Fault mechanisms of the real lab, one module each; every one is made by the OS or by config.

In-process faults (`host_stall`, `slow_operator`, `scheduler_misconfig`) run inside the rank
processes and are driven by `inprocess`; OS faults (`cpu_contention`, `straggler`, `net_throttle`,
`memory_pressure`) are applied to a rank's pid or link from outside by `teller.lab.run`;
`workload_shift` changes only the request generator. Windows are in seconds after serve start.
"""
