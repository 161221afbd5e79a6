"""Sharding a map-style dataset across ranks, without a framework.

``DistributedSampler`` takes ``torch.utils.data.DistributedSampler``'s arguments and gives the
same indices for the same ``(seed, epoch)``, plus two things torch's lacks:

* ``mode="eval"``: every sample is seen exactly once across ranks, with no padded duplicates
  (ranks may then differ by one sample; see below).
* A position in the epoch that does not depend on the world size, so a job checkpointed on
  ``W`` ranks resumes on ``W'`` ranks without losing or repeating a sample.

**The global order.** An epoch's order is one permutation of all ``N`` indices, drawn from
``torch.Generator().manual_seed(seed + epoch)`` exactly as torch's sampler draws it (``range(N)``
with ``shuffle=False``). The world size plays no part in it.

**Interleaved, not blocks.** Rank ``r`` of ``W`` takes positions ``r, r + W, r + 2W, ...`` of
that order (as torch does). Why interleaved: once every rank has taken ``k`` samples, the samples
taken by all ranks together are exactly the first ``W * k`` positions of the global order, a
prefix. A prefix is one number (``position``) that means the same thing on any world size:
the rest of the epoch is ``order[position:]``, which the new ranks interleave again. With
contiguous blocks, ``k`` samples per rank are ``W`` separate runs of the order, which a different
``W'`` cannot continue without a list of what was seen.

**Train and eval.** ``mode="train"`` (the default, torch's behaviour) gives every rank the same
number of samples, so a collective per batch never hangs: the tail is padded by wrapping round
the samples left in the order (a few repeat in the last step), or dropped with ``drop_last=True``.
``mode="eval"`` pads nothing: rank ``r`` gets ``ceil((R - r) / W)`` of the ``R`` samples left,
so the last step has fewer samples on some ranks, possibly none. The evaluation loop must then
not run a collective per batch (gather the results once, after the loop), or must use
``max_num_samples`` to add empty steps on the ranks that ran out.

**Resume across world sizes.** ``state_dict(samples_per_rank=k)`` records
``(seed, epoch, position)`` with ``position = start + W * k``, capped at ``N``, where ``start``
is where this iteration began and ``k`` the samples every rank has taken (the same ``k`` on all
ranks: take the checkpoint at a step all ranks reached). A sampler on any world size that
``load_state_dict``-s it yields, in that epoch, only ``order[position:]``, shared out
between its ranks as above: no sample of the epoch is lost or repeated across the change.
(In ``mode="train"`` the epoch's last step still pads or drops, as in any epoch.) Without
``samples_per_rank``, ``k`` is the number of indices this sampler has handed out in its current
iteration; a loader with workers pulls indices ahead of the batches you have received, so pass
the samples your loop has actually consumed.

The code is in ``gpufeed._resume.sampler``; this module re-exports its public names.
"""

from gpufeed._resume.sampler import DistributedSampler

__all__ = ["DistributedSampler"]
