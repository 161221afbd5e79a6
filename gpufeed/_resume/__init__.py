"""Exact mid-epoch resume (docs/design/resume.md): the positions of loaders and samplers.

``rng`` (a worker's random states) and ``positions`` (per-worker records of a pass) are written
by the engine; ``sampler_state`` and ``indices`` (the index stream, the state's format) by the
loader's side; ``loader`` is ``FastLoader``'s ``state_dict`` / ``load_state_dict``; ``sampler``
is gpufeed's ``DistributedSampler``. Nothing here imports the engine: the engine imports this.
"""
