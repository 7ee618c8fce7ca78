"""Labelled data: real workloads under real faults (lab) and the GPU-cluster trace simulator (sim)."""
