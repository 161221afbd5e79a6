"""Observation below the public tools: process-tree probes and memory, tuning rules."""
