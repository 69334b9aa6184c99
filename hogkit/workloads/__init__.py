"""Workloads: data, gradient and loss for each training problem."""
