"""gpufeed's ``DistributedSampler`` (public name; the code is in ``gpufeed._resume.sampler``)."""

from gpufeed._resume.sampler import DistributedSampler

__all__ = ["DistributedSampler"]
