"""The worker engine: worker processes writing batches into one shared memfd arena.

It knows nothing of images: the image path plugs into the worker through a filler (see
``gpufeed._engine.worker``). See docs/design/engine-lifecycle.md.
"""
