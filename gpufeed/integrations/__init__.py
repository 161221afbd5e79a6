"""Integrations with training frameworks (Accelerate; see docs/training.md)."""
