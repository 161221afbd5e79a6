"""Measurements shared by the doctor, the tuner, the comparison harness and serving: the PSS of
a process tree (``memory``) and batch counting (``batches``)."""
