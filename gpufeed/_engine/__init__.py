"""The worker engine: worker processes writing batches into one shared memfd arena.

``engine`` (the task stream: submit, replies, deaths, shutdown), ``iterator`` (FastIter: torch's
DataLoader policy driving it), ``pool`` (processes), ``worker`` (the process entry),
``messages`` (the wire protocol), ``arena`` / ``ledger`` (slots), ``transport`` (pack/unpack),
``context`` (what lives as long as a loader) and ``plugin`` (the filler interface).

It knows nothing of images: the image path plugs in through ``plugin.FillPlugin`` and
``plugin.BatchFiller``. See docs/design/engine-lifecycle.md.
"""
