"""Observation for operators: Prometheus metrics of servers and KV pools."""
