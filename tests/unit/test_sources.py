"""gpufeed.sources: ImageFolder indexing, ImageDataset wrapping, errors naming files, pickling."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from gpufeed.decoders import decode
from gpufeed.errors import DecodeError
from gpufeed.image import RandomResizedCrop, ResizeCenterCrop
from gpufeed.sources import (
    IMG_EXTENSIONS,
    ImageDataset,
    ImageFolder,
    ImageSource,
    LMDBDataset,
    pack,
)
from gpufeed.synth import encode, make_image_folder, photo_like

# --- torchvision's rules, transcribed (torchvision is not installed) ---------------------------

def tv_find_classes(directory):
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {cls_name: i for i, cls_name in enumerate(classes)}


def tv_make_dataset(directory, class_to_idx, extensions=IMG_EXTENSIONS):
    instances = []
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if path.lower().endswith(extensions):
                    instances.append((path, class_index))
    return instances


@pytest.fixture
def tricky_tree(tmp_path):
    """Mixed-case class names and extensions, nesting, non-images, hidden files, a stray file."""
    root = tmp_path / "tree"
    jpeg = encode(photo_like(20, 30, seed=1))
    png = encode(photo_like(20, 30, seed=2), "png")
    layout = {
        "b_class/x.JPG": jpeg, "b_class/a.jpeg": jpeg, "b_class/notes.txt": b"text",
        "b_class/sub/z.png": png, "b_class/sub/deeper/y.Webp": encode(photo_like(8, 8), "webp"),
        "B_upper/1.bmp": encode(photo_like(9, 9), "bmp"), "B_upper/.hidden.jpg": jpeg,
        "a_first/img.TIFF": png, "a_first/img.jpg.bak": jpeg, "a_first/Img.PnG": png,
        "Z/0.ppm": jpeg, "Z/0.pgm": jpeg, "Z/1.tif": jpeg,
        "stray.jpg": jpeg,
    }
    for rel, data in layout.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root)


def test_image_folder_indexing_matches_torchvision(tricky_tree):
    ds = ImageFolder(tricky_tree)
    classes, class_to_idx = tv_find_classes(tricky_tree)
    assert ds.classes == classes == ["B_upper", "Z", "a_first", "b_class"]
    assert ds.class_to_idx == class_to_idx
    assert ds.samples == tv_make_dataset(tricky_tree, class_to_idx)
    assert ds.targets == [c for _, c in ds.samples]
    assert ds.imgs == ds.samples
    assert len(ds) == 11


def test_image_folder_root_given_with_trailing_slash(tricky_tree):
    ds = ImageFolder(tricky_tree + "/")
    assert ds.samples == tv_make_dataset(tricky_tree + "/", tv_find_classes(tricky_tree)[1])


def test_image_folder_stores_arrays_not_lists(tmp_path):
    make_image_folder(tmp_path, num_classes=2, per_class=50, size=(16, 16))
    ds = ImageFolder(tmp_path)
    for name, value in vars(ds).items():
        if isinstance(value, (list, tuple, dict)):
            assert len(value) <= len(ds.classes), f"per-sample Python container in {name}"
    assert ds.labels.dtype == np.int64 and not ds.labels.flags.writeable
    assert ds.describe(57) == ds.samples[57][0] and ds.label(57) == 1


def test_image_folder_errors_say_what_was_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; expected ROOT/CLASS_NAME/IMAGE"):
        ImageFolder(tmp_path / "missing")
    (tmp_path / "flat.jpg").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="no class folders found"):
        ImageFolder(tmp_path)
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "readme.txt").write_text("no images")
    with pytest.raises(FileNotFoundError) as info:
        ImageFolder(tmp_path)
    assert "'cats'" in str(info.value) and ".jpg" in str(info.value) and ".webp" in str(info.value)


def test_getitem_full_image_and_transformed(tmp_path):
    make_image_folder(tmp_path, num_classes=2, per_class=3, size=(50, 70))
    ds = ImageFolder(tmp_path)
    image, label = ds[4]
    assert image.dtype == torch.uint8 and image.shape == (3, 50, 70) and label == 1
    with open(ds.samples[4][0], "rb") as f:
        assert np.array_equal(image.numpy(), decode(f.read()).transpose(2, 0, 1))
    ds.transform = ResizeCenterCrop(32, 40)
    image, _ = ds[-1]
    assert image.shape == (3, 32, 32) and image.is_contiguous()
    with pytest.raises(IndexError, match="out of range"):
        ds[6]


def test_set_epoch_changes_random_crops(tmp_path):
    make_image_folder(tmp_path, num_classes=1, per_class=4, size=(80, 90))
    ds = ImageFolder(tmp_path, transform=RandomResizedCrop(24, seed=5))
    first = [ds[i][0] for i in range(4)]
    assert all(torch.equal(a, ds[i][0]) for i, a in enumerate(first))
    ds.set_epoch(1)
    assert not all(torch.equal(a, ds[i][0]) for i, a in enumerate(first))


# --- bad files through ImageSource --------------------------------------------------------------

BAD_FILES = {
    "truncated.jpg": lambda: encode(photo_like(60, 60, seed=1))[:700],
    "empty.jpg": lambda: b"",
    "text.jpg": lambda: b"this is not an image at all",
    "truncated.png": lambda: encode(photo_like(60, 60, seed=1), "png")[:200],
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("with_transform", [False, True])
def test_bad_file_raises_decode_error_naming_path_and_index(tmp_path, name, with_transform):
    make_image_folder(tmp_path, num_classes=1, per_class=2, size=(40, 40))
    (tmp_path / "class_00" / name).write_bytes(BAD_FILES[name]())
    ds = ImageFolder(tmp_path, transform=RandomResizedCrop(16) if with_transform else None)
    index = [p for p, _ in ds.samples].index(str(tmp_path / "class_00" / name))
    with pytest.raises(DecodeError) as info:
        ds[index]
    message = str(info.value)
    assert str(tmp_path / "class_00" / name) in message and f"sample index {index}" in message
    ds[1 - index if index < 2 else 0]  # the good ones still load


def test_missing_file_keeps_oserror_with_note(tmp_path):
    make_image_folder(tmp_path, num_classes=1, per_class=2, size=(20, 20))
    ds = ImageFolder(tmp_path)
    os.remove(ds.describe(1))
    with pytest.raises(FileNotFoundError) as info:
        ds[1]
    assert any("sample index 1" in note for note in getattr(info.value, "__notes__", []))


def test_bad_bytes_in_wrapped_dataset_name_the_item(tmp_path):
    good = encode(photo_like(30, 30, seed=1))
    items = [(good, 0), (good[:300], 1)]

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return items[i]

    ds = ImageDataset(Items())
    assert ds[0][0].shape == (3, 30, 30)
    with pytest.raises(DecodeError, match=r"Items\[1\] \(sample index 1\)"):
        ds[1]


def test_bad_lmdb_record_names_the_key(tmp_path):
    src = tmp_path / "src"
    make_image_folder(src, num_classes=1, per_class=3, size=(40, 40))
    (src / "class_00" / "img_00001.jpg").write_bytes(encode(photo_like(40, 40))[:500])
    pack(src, tmp_path / "db.lmdb", progress=False, verify=False)  # header intact: stored as is
    ds = LMDBDataset(tmp_path / "db.lmdb", transform=ResizeCenterCrop(16, 20))
    with pytest.raises(DecodeError) as info:
        ds[1]
    assert "lmdb:0000000001" in str(info.value) and "img_00001.jpg" in str(info.value)
    assert "sample index 1" in str(info.value)


# --- ImageDataset ------------------------------------------------------------------------------

class TorchvisionLike:
    """What torchvision's ImageFolder exposes: samples, classes, class_to_idx."""

    def __init__(self, root):
        self.classes, self.class_to_idx = tv_find_classes(root)
        self.samples = tv_make_dataset(root, self.class_to_idx)


def test_image_dataset_from_samples_list(tmp_path):
    make_image_folder(tmp_path, num_classes=3, per_class=4, size=(30, 40))
    tv = TorchvisionLike(str(tmp_path))
    ds = ImageDataset(tv, transform=ResizeCenterCrop(16, 20))
    assert ds._source is None  # the list was copied into arrays, the object not kept
    assert ds.samples == tv.samples and ds.classes == tv.classes and len(ds) == 12
    folder = ImageFolder(tmp_path, transform=ResizeCenterCrop(16, 20))
    for i in (0, 5, 11):
        assert torch.equal(ds[i][0], folder[i][0]) and ds[i][1] == folder[i][1]
    assert ImageDataset(tv.samples).samples == tv.samples  # a plain list of pairs works too


def test_image_dataset_over_items_of_paths_and_bytes(tmp_path):
    make_image_folder(tmp_path, num_classes=1, per_class=2, size=(30, 40))
    folder = ImageFolder(tmp_path)
    path = folder.describe(1)
    with open(path, "rb") as f:
        data = f.read()

    class Mixed(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return [(path, 7), (data, 8), (memoryview(data), 9)][i]

    ds = ImageDataset(Mixed())
    assert [ds.label(i) for i in range(3)] == [7, 8, 9]
    assert ds.describe(0) == path and ds.describe(1) == "Mixed[1]"
    assert all(torch.equal(ds[i][0], folder[1][0]) for i in range(3))


def test_image_dataset_over_a_list_of_bytes_and_labels(tmp_path):
    make_image_folder(tmp_path, num_classes=1, per_class=2, size=(30, 40))
    folder = ImageFolder(tmp_path)
    pairs = []
    for i in range(2):
        with open(folder.describe(i), "rb") as f:
            pairs.append((f.read(), 5 + i))
    ds = ImageDataset(pairs)
    assert len(ds) == 2 and [ds.label(i) for i in range(2)] == [5, 6]
    assert all(torch.equal(ds[i][0], folder[i][0]) for i in range(2))


def test_messages_shorten_a_long_value():
    jpeg = b"\xff\xd8" + b"\x00" * 100_000
    with pytest.raises(TypeError, match=r"list of \(path, class_index\)") as info:
        ImageDataset([("a.jpg", 0), (jpeg, 1)])  # bytes after a path: a mixed list
    assert "Found: (b'\\xff\\xd8" in str(info.value) and len(str(info.value)) < 300


def test_image_dataset_rejects_bad_items():
    with pytest.raises(TypeError, match="must be a map-style dataset"):
        ImageDataset(42)
    with pytest.raises(TypeError, match=r"must be a list of \(path, class_index\)"):
        ImageDataset([(1, 2)])

    class Bad(torch.utils.data.Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return np.zeros(3), 1

    with pytest.raises(TypeError, match="items of the wrapped dataset must be"):
        ImageDataset(Bad())[0]


# --- pickling and torch's DataLoader -----------------------------------------------------------

@pytest.fixture(scope="module")
def packed(tmp_path_factory, image_folder):
    root = tmp_path_factory.mktemp("packed")
    src = image_folder(num_classes=3, per_class=4, size=((40, 80), (40, 80)), seed=3)
    (root / "src").symlink_to(src, target_is_directory=True)
    pack(root / "src", root / "db.lmdb", progress=False)
    return root


def _sources(root):
    t = RandomResizedCrop(24, seed=3)
    return [ImageFolder(root / "src", transform=t), ImageDataset(TorchvisionLike(str(root / "src")),
            transform=t), LMDBDataset(root / "db.lmdb", transform=t)]


def test_sources_pickle_round_trip(packed):
    for ds in _sources(packed):
        ds[0]  # an LMDB environment is open now: it must not travel
        copy = pickle.loads(pickle.dumps(ds))
        assert type(copy) is type(ds) and len(copy) == len(ds)
        for i in (0, len(ds) - 1):
            assert torch.equal(copy[i][0], ds[i][0]) and copy[i][1] == ds[i][1]


def test_sources_agree_with_each_other(packed):
    a, b, c = _sources(packed)
    for i in range(len(a)):
        assert torch.equal(a[i][0], b[i][0]) and torch.equal(a[i][0], c[i][0])
        assert a[i][1] == b[i][1] == c[i][1]
    assert isinstance(c, ImageSource) and c.classes == a.classes

