"""Several outputs (views) of one decoded image: ``MultiView`` (docs/design/sample-model.md,
sections 1-3).

A ``MultiView`` holds one pipeline per view: a gpufeed transform, or a torchvision/timm pipeline
translated as a dataset's transform is (``from_torchvision``). When every pipeline translates, a
sample is decoded once, at the DCT scale the most demanding view needs, and each view is
cropped, resized and augmented from that image into its own region of the batch slot
(``decode_views``); view v draws its random parameters from (seed, epoch, index, v), view 0
under the keys of a transform on its own. A batch's image part is a list of tensors, one per
view, as ``DataLoader`` collates a transform returning a list. When a pipeline does not
translate, the ``MultiView`` is a plain callable (the generic path): it calls every pipeline on
the PIL image and returns the list.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from gpufeed.decoders._header import Buffer
from gpufeed.errors import describe_callable, shorten
from gpufeed.image._torchvision import explain_one, is_torchvision, translate_or_none, untranslated_reasons
from gpufeed.image._transforms import ImageTransform, decode_views

__all__ = ["MultiView", "explain_transform"]


class MultiView:
    """Several views of one image: ``MultiView([pipeline, ...])``, each pipeline a gpufeed
    transform (``RandomResizedCrop``, ``ResizeCenterCrop``, ``Resize``, with their ops) or a
    torchvision/timm pipeline gpufeed translates; views may differ in size.

    As a dataset's transform, ``dataset[i]`` returns ``([view tensors], target)`` and a
    ``FastLoader`` batches ``([view batches], targets)``, one decode per sample. The views must
    agree on what one decode and one batch conversion serve: the EXIF orientation (gpufeed
    transforms apply it, translated torchvision pipelines do not), the decode backend, and a
    translated pipeline's ``Normalize`` and dtype (a ``ValueError`` naming the two views
    otherwise). A pipeline that does not translate (or any other callable) makes this a plain
    callable on a PIL image: the loader takes its generic path, and says why.
    """

    def __init__(self, pipelines: Iterable[Any]) -> None:
        if isinstance(pipelines, (str, bytes)) or not isinstance(pipelines, Iterable):
            raise TypeError(f"`pipelines` must be a sequence of transforms, one per view. "
                            f"Found: {shorten(pipelines)}.")
        self.pipelines = tuple(pipelines)
        if not self.pipelines:
            raise ValueError("`pipelines` must hold at least one transform. Found: none.")
        translated: list[ImageTransform] = []
        blockers: list[str] = []
        for v, pipeline in enumerate(self.pipelines):
            one = _translate(v, pipeline)
            if isinstance(one, str):
                blockers.append(one)
            else:
                translated.append(one)
        #: Why the views do not all translate ("view k: ..."), empty when they do.
        self.blockers = tuple(blockers)
        self._views: tuple[ImageTransform, ...] = ()
        if not blockers:
            self._views = tuple(t.with_view(v) for v, t in enumerate(translated))
            _check_agree(self._views)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.translated:  # workers need the translations only (no torchvision objects)
            return MultiView, (self._views,)
        return MultiView, (self.pipelines,)

    @property
    def translated(self) -> bool:
        """Every pipeline is a gpufeed transform or translates: the image fast path."""
        return not self.blockers

    @property
    def views(self) -> tuple[ImageTransform, ...]:
        """The gpufeed transform of each view (view v's keyed by v: ``with_view``); empty when
        a pipeline does not translate."""
        return self._views

    def _first(self) -> ImageTransform:
        if not self._views:
            raise ValueError(f"this MultiView runs its pipelines as given (the generic path): "
                             f"{'; '.join(self.blockers)}.")
        return self._views[0]

    @property
    def seed(self) -> int | None:
        """The first seed a view's transform carries (None: the loader's)."""
        return next((v.seed for v in self._views if v.seed is not None), None)

    @property
    def deterministic(self) -> bool:
        return all(v.deterministic for v in self._views)

    @property
    def apply_exif(self) -> bool:
        """Whether the one decode applies the EXIF orientation (the views agree on it)."""
        if self._views:
            return self._views[0].apply_exif
        return not any(is_torchvision(p) for p in self.pipelines)

    @property
    def float_ops(self) -> tuple[Any, ...]:
        """Every view's float ops (run per view, on its normalized rows)."""
        return tuple(op for v in self._views for op in v.float_ops)

    def batch_options(self, normalize: Any, dtype: Any) -> tuple[Any, Any]:
        """The loader's (normalize, dtype) with the views' (which agree): view 0's rule."""
        return self._first().batch_options(normalize, dtype)

    def apply_views(self, data: Buffer, *, index: int = 0, epoch: int = 0, seed: int = 0,
                    outs: list[np.ndarray]) -> float:
        """Decode ``data`` once and write view v into ``outs[v]`` (uint8, (H, W, 3) or (3, H, W)
        at view v's size); returns the seconds spent decoding."""
        self._first()
        views = self._views
        if len(outs) != len(views):
            raise ValueError(f"`outs` must hold one row per view ({len(views)}). Found: {len(outs)}.")
        return decode_views(views, data, index, epoch, seed, outs)

    def outputs(self, data: Buffer, *, index: int = 0, epoch: int = 0, seed: int = 0) -> list[Any]:
        """What ``dataset[i]`` returns for sample ``index``'s bytes: each view's output (a uint8
        CHW tensor, or what its translated pipeline returns)."""
        self._first()
        outs = [np.empty((3, *v.output_size), np.uint8) for v in self._views]
        self.apply_views(data, index=index, epoch=epoch, seed=seed, outs=outs)
        return [v.to_output(torch.from_numpy(out), index=index, epoch=epoch, seed=seed)
                for v, out in zip(self._views, outs)]

    def __call__(self, image: Any) -> list[Any]:
        """The generic path: every pipeline called on ``image`` (a PIL RGB image), in order; a
        gpufeed transform among them runs on the image's pixels (``apply_array``)."""
        results = []
        for v, pipeline in enumerate(self.pipelines):
            if isinstance(pipeline, ImageTransform):
                out = np.empty((3, *pipeline.output_size), np.uint8)
                pixels = np.ascontiguousarray(np.asarray(image.convert("RGB")))
                pipeline.with_view(v).apply_array(pixels, out=out, seed=pipeline.seed or 0)
                results.append(torch.from_numpy(out))
            else:
                results.append(pipeline(image))
        return results

    def sizes(self) -> list[tuple[int, int]]:
        """(height, width) of each view."""
        return [tuple(v.output_size) for v in self._views]  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self.pipelines)

    def __repr__(self) -> str:
        return f"MultiView([{', '.join(repr(p) for p in self.pipelines)}])"

    def explain(self) -> str:
        """One block per distinct pipeline with the views it serves, then the shared decode."""
        n = len(self.pipelines)
        if not self.translated:
            head = (f"MultiView of {n} views: generic path (each worker calls every pipeline on the "
                    f"PIL image and returns the list), because {'; '.join(self.blockers)}.")
        else:
            head = (f"MultiView of {n} views: fast path; one decode per sample, at the scale the "
                    f"largest demand of {_span(list(range(n)))} needs (the most source pixels per "
                    "output pixel), then each view's crop, resize and ops from that image; view v "
                    "draws its parameters from (seed, epoch, index, v).")
        groups: dict[int, list[int]] = {}  # one block per pipeline object (reprs may hide a p)
        for v, pipeline in enumerate(self.pipelines):
            groups.setdefault(id(pipeline), []).append(v)
        lines = [head]
        for members in groups.values():
            first = members[0]
            shown = self._views[first] if self._views else self.pipelines[first]
            size = (" ({}x{})".format(*self._views[first].output_size) if self._views else "")
            text = explain_one(shown).replace("\n", "\n    ")
            if isinstance(shown, ImageTransform) and not hasattr(shown, "routes"):
                text = f"{shown!r}: {text}"  # a gpufeed transform: its parameters
            lines.append(f"  {_span(members)}{size}: {text}")
        return "\n".join(lines)


def _translate(v: int, pipeline: Any) -> ImageTransform | str:
    """View ``v``'s gpufeed transform, or why it has none (a TypeError for what no path takes)."""
    if isinstance(pipeline, MultiView):
        raise TypeError(f"view {v} is a MultiView; fix: list its pipelines in this one.")
    if isinstance(pipeline, ImageTransform):
        return pipeline
    if is_torchvision(pipeline):
        translated, _ = translate_or_none(pipeline)
        if translated is None:
            return f"view {v}: {untranslated_reasons(pipeline)}"
        return translated
    if callable(pipeline):
        return (f"view {v}: {describe_callable(pipeline)} is a callable gpufeed cannot look into "
                f"(use a gpufeed transform or a torchvision pipeline gpufeed translates)")
    raise TypeError(f"view {v} must be a gpufeed transform, a torchvision/timm pipeline or a "
                    f"callable. Found: {type(pipeline).__name__} {shorten(pipeline)}.")


def _check_agree(views: tuple[ImageTransform, ...]) -> None:
    """ValueError naming the first view that disagrees with view 0 on what the views share."""
    first = views[0]
    for v, view in enumerate(views[1:], 1):
        for what, mine, theirs in (
                ("EXIF orientation (gpufeed transforms apply it, torchvision pipelines do not)",
                 first.apply_exif, view.apply_exif),
                ("decode backend", first.backend, view.backend),
                ("Normalize and dtype", first.batch_options(None, None), view.batch_options(None, None))):
            if mine != theirs:
                raise ValueError(
                    f"the views of a MultiView share one decode and one batch conversion, so they "
                    f"must agree on the {what}: view 0 has {mine}, view {v} has {theirs}. Fix: "
                    f"give every view the same (e.g. all gpufeed transforms or all torchvision "
                    f"pipelines with the same Normalize).")


def _span(members: list[int]) -> str:
    """"view 3", "views 0-1", "views 0, 2, 5"."""
    if len(members) == 1:
        return f"view {members[0]}"
    if members == list(range(members[0], members[-1] + 1)):
        return f"views {members[0]}-{members[-1]}"
    return "views " + ", ".join(map(str, members))


def explain_transform(transform: Any) -> str:
    """A short report of which ops of ``transform`` run on gpufeed's fast path and which do not,
    and why (one line per op); for a ``MultiView``, one block per distinct pipeline with the
    views it serves, and the shared decode; for gpufeed's own transforms, torchvision/timm
    pipelines, other callables and None too."""
    if isinstance(transform, MultiView):
        return transform.explain()
    return explain_one(transform)
