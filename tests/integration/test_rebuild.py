"""A FastLoader rebuilt from its attributes (as Lightning rebuilds loaders to inject a sampler),
``replace``d or pickled is an equivalent loader; ``set_epoch`` reaches the sampler."""

from __future__ import annotations

import inspect
import pickle
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, TensorDataset

from gpufeed import FastLoader, GpufeedWarning, ImageFolder, ResizeCenterCrop

pytestmark = pytest.mark.timeout(60)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def rebuild(loader: FastLoader, **overrides):
    """What a framework does: every signature parameter read back with getattr (the sampler
    passed as ``sampler`` when torch made the batch sampler, else the batch sampler), then the
    overrides."""
    params = inspect.signature(FastLoader).parameters
    readable = set(vars(loader)) | {"multiprocessing_context"}  # torch's one property
    kwargs = {name: getattr(loader, name) for name in params if name in readable}
    if loader.batch_size is not None:  # torch made the batch sampler from batch_size
        kwargs.pop("batch_sampler")
    else:
        for name in ("batch_size", "drop_last", "sampler"):
            kwargs.pop(name, None)
    kwargs.update(overrides)
    return FastLoader(**kwargs)


def batches(loader, generator=None):
    if generator is not None:
        generator.manual_seed(7)
    return [[t.clone() for t in batch] for batch in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


def options_of(loader) -> dict:
    return {name: getattr(loader, name) for name in inspect.signature(FastLoader).parameters
            if inspect.signature(FastLoader).parameters[name].kind is inspect.Parameter.KEYWORD_ONLY}


def tensor_loader(**kw):
    ds = TensorDataset(torch.arange(40), torch.arange(40) * 10)
    return FastLoader(ds, **kw)


def test_every_option_is_a_plain_attribute_holding_the_value_given(tmp_path):
    loader = tensor_loader(max_worker_restarts=5, max_batch_bytes=1 << 21, shutdown_timeout_s=2.5,
                           cache_bytes=None, device="cpu", prefetch_batches=3, pin_workers=True,
                           log_dir=tmp_path, metrics_port=None)
    sig = inspect.signature(FastLoader).parameters
    options = [n for n, p in sig.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
               and n not in inspect.signature(torch.utils.data.DataLoader).parameters]
    assert set(options) <= set(vars(loader))  # vars(): plain attributes, as Lightning reads them
    assert options_of(loader)["log_dir"] == tmp_path and loader.device == "cpu"
    assert loader.prefetch_batches == 3 and loader.pin_workers is True and loader.shutdown_timeout_s == 2.5
    for name in options:
        with pytest.raises(ValueError, match=f"{name} attribute should not be set after FastLoader is initialized"):
            setattr(loader, name, getattr(loader, name))
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):  # torch's own check
        loader.batch_size = 2


@pytest.mark.parametrize("kw", [dict(), dict(shuffle=True), dict(drop_last=True, batch_size=7)])
def test_generic_rebuild_from_signature_and_attributes_gives_the_same_batches(kw):
    gen = torch.Generator()
    kw = dict(dict(batch_size=4, num_workers=2, generator=gen, max_worker_restarts=1), **kw)
    loader = tensor_loader(**kw)
    again = rebuild(loader)
    assert options_of(again) == options_of(loader)
    assert same(batches(loader, gen), batches(again, gen))
    loader.close()
    again.close()


def test_rebuild_with_a_batch_sampler():
    ds = TensorDataset(torch.arange(20))
    loader = FastLoader(ds, batch_sampler=BatchSampler(range(20), 6, False), num_workers=2)
    assert same(batches(rebuild(loader)), batches(loader))


@pytest.fixture(scope="module")
def image_root(image_folder):
    return image_folder(num_classes=2, per_class=8, size=(120, 140), seed=3)


def test_image_rebuild_keeps_normalize_dtype_and_layout(image_root):
    ds = ImageFolder(image_root, transform=ResizeCenterCrop(48, 64))
    loader = FastLoader(ds, batch_size=5, num_workers=2, normalize=(MEAN, STD), dtype=torch.float16,
                        channels_last=True, cache_bytes="1%")
    again = rebuild(loader)
    assert again.cache_bytes == "1%" and again.normalize == (MEAN, STD)
    a, b = batches(loader), batches(again)
    assert same(a, b)
    images = b[0][0]
    assert images.dtype == torch.float16 and images.is_contiguous(memory_format=torch.channels_last)
    loader.close()
    again.close()


def test_replace_changes_only_what_is_given():
    gen = torch.Generator()
    loader = tensor_loader(batch_size=4, shuffle=True, generator=gen, num_workers=2, shutdown_timeout_s=3.0)
    bigger = loader.replace(batch_size=10)
    assert bigger.batch_size == 10 and bigger.shutdown_timeout_s == 3.0 and bigger.num_workers == 2
    assert bigger.sampler is loader.sampler
    ordered = loader.replace(shuffle=False, num_workers=0)
    assert [b[0].tolist() for b in ordered][0] == [0, 1, 2, 3]
    assert sorted(torch.cat([b[0] for b in batches(bigger, gen)]).tolist()) == list(range(40))
    with pytest.raises(TypeError, match="unknown"):
        loader.replace(batchsize=3)
    with pytest.raises(ValueError, match="prefetch_batches"):
        loader.replace(prefetch_batches=0)


def test_a_loader_pickles_to_its_arguments_and_iterates_unpickled(image_root):
    gen = torch.Generator()
    # a start method other than the default travels with the pickle; forkserver, not spawn: its
    # workers pickle their arguments just the same, without a fresh interpreter each (the start
    # methods themselves: test_parity_workers.py::test_start_methods)
    loader = tensor_loader(batch_size=8, shuffle=True, generator=gen, num_workers=2,
                           multiprocessing_context="forkserver", max_batch_bytes=1 << 22)
    first = batches(loader, gen)  # a loader that has workers and an arena still pickles
    copy = pickle.loads(pickle.dumps(loader))
    assert copy is not loader and copy._arena is None and copy.max_batch_bytes == 1 << 22
    assert copy.multiprocessing_context.get_start_method() == "forkserver"
    assert same(batches(copy, copy.generator), first)
    loader.close()
    copy.close()
    image = FastLoader(ImageFolder(image_root, transform=ResizeCenterCrop(32)), batch_size=4, dtype=torch.float32)
    assert same(batches(pickle.loads(pickle.dumps(image))), batches(image))


def distributed(shuffle=True, **kw):
    ds = TensorDataset(torch.arange(16))
    sampler = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=shuffle, seed=1)
    return FastLoader(ds, batch_size=4, sampler=sampler, **kw), sampler


def test_set_epoch_forwards_to_the_distributed_sampler_and_changes_the_order():
    loader, sampler = distributed(num_workers=2)
    loader.set_epoch(0)
    zero = torch.cat([b[0] for b in loader]).tolist()
    loader.set_epoch(3)
    assert sampler.epoch == 3 and loader._epoch == 3
    three = torch.cat([b[0] for b in loader]).tolist()
    assert zero != three and len(zero) == len(three) == 8  # rank 0's half of another permutation
    loader.close()


def test_iterating_again_without_set_epoch_warns_exactly_once():
    loader, _ = distributed()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            loader.set_epoch(epoch)
            list(loader)
        assert not [w for w in caught if issubclass(w.category, GpufeedWarning)]
        list(loader)
        list(loader)
    got = [w for w in caught if issubclass(w.category, GpufeedWarning)]
    assert len(got) == 1 and "set_epoch" in str(got[0].message) and "DistributedSampler" in str(got[0].message)
    unshuffled, _ = distributed(shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpufeedWarning)
        list(unshuffled)
        list(unshuffled)


def test_metrics_port_is_offset_by_local_rank(monkeypatch):
    pytest.importorskip("prometheus_client")
    import socket

    with socket.socket() as sock:  # a port that is free now, and the next one
        sock.bind(("127.0.0.1", 0))
        base = sock.getsockname()[1]
    servers = []
    try:
        for rank in (0, 1):
            monkeypatch.setenv("LOCAL_RANK", str(rank))
            loader = tensor_loader(metrics_port=base)
            assert loader.metrics_port == base  # the value given; the bound port is the server's
            servers.append(loader.metrics_server)
        assert [s.port for s in servers] == [base, base + 1]
    finally:
        for server in servers:
            server.stop()


def test_metrics_port_in_use_by_another_program_warns_instead_of_failing():
    pytest.importorskip("prometheus_client")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.warns(GpufeedWarning, match="cannot be bound"):
            loader = tensor_loader(metrics_port=sock.getsockname()[1])
    assert loader.metrics_server is None
