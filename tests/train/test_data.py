"""Data: seeded split, batched augmentation vs a per-sample reference, loaders, sources and their errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hne_edge.errors import InputError
from hne_edge.train.config import DataConfig
from hne_edge.train.data import (ArrayDataset, Augment, BatchLoader, epoch_generator, load_data, load_npz,
                                 npz_fingerprint, split_indices)


def _images(n=10, c=3, s=6, seed=0) -> torch.Tensor:
    return torch.randint(0, 256, (n, c, s, s), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_split_is_seeded_disjoint_and_complete():
    train, val = split_indices(100, 0.2, seed=3)
    assert len(val) == 20 and len(train) == 80
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert sorted(train.tolist() + val.tolist()) == list(range(100))
    again = split_indices(100, 0.2, seed=3)
    assert torch.equal(again[0], train) and torch.equal(again[1], val)
    assert not torch.equal(split_indices(100, 0.2, seed=4)[1], val)
    small_train, same_val = split_indices(100, 0.2, seed=3, limit=7)
    # --limit caps the training images only (issue 20 item 6: it capped validation at 7 too); the hold-out is whole
    assert len(small_train) == 7 and set(small_train.tolist()) <= set(train.tolist()) and torch.equal(same_val, val)
    _, small_val = split_indices(100, 0.2, seed=3, limit=7, val_limit=5)
    # --val-limit caps it, as a subset of the full one
    assert len(small_val) == 5 and set(small_val.tolist()) <= set(val.tolist())


def test_an_epoch_resumed_part_way_yields_the_rest_of_the_same_batches():
    ds = ArrayDataset(_images(n=50), torch.arange(50) % 10)
    loader = BatchLoader(ds, 8, mean=(0.5,) * 3, std=(0.25,) * 3, shuffle=True, augment=Augment(2, True), drop_last=True,
                         seed=1)
    loader.set_epoch(3)
    whole = list(loader)
    loader.set_epoch(3, start=4)  # the crops and flips of batches 0-3 are drawn, not computed
    rest = list(loader)
    assert len(whole) == 6 and len(rest) == 2 and len(loader) == 6
    for (xa, ya), (xb, yb) in zip(whole[4:], rest):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_augment_matches_per_sample_pad_crop_flip():
    images = _images()
    aug = Augment(pad=2, flip=True)
    out = aug(images, torch.Generator().manual_seed(5))
    # replay the same draws and do it one image at a time
    g = torch.Generator().manual_seed(5)
    offsets = torch.randint(0, 5, (10, 2), generator=g)
    flips = torch.rand(10, generator=g) < 0.5
    for i in range(10):
        padded = F.pad(images[i], (2, 2, 2, 2))
        oy, ox = offsets[i].tolist()
        crop = padded[:, oy : oy + 6, ox : ox + 6]
        if flips[i]:
            crop = crop.flip(-1)
        assert torch.equal(out[i], crop), i
    assert 0 < flips.sum() < 10  # both branches exercised


def test_augment_slice_uses_whole_batch_draws():
    images = _images()
    full = Augment(pad=2)(images, torch.Generator().manual_seed(1))
    part = Augment(pad=2)(images, torch.Generator().manual_seed(1), slice(5, 10))
    assert torch.equal(part, full[5:])


def test_no_flip_augment_never_mirrors():
    images = _images(n=50, c=1, s=4)
    out = Augment(pad=0, flip=False)(images, torch.Generator().manual_seed(0))
    assert torch.equal(out, images)


def test_loader_is_seeded_per_epoch_and_normalises():
    ds = ArrayDataset(_images(n=20), torch.arange(20))
    kw = dict(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), shuffle=True, seed=7)
    a = BatchLoader(ds, 8, drop_last=True, **kw)
    assert len(a) == 2
    labels0 = [y for _, y in a]
    assert [y.tolist() for _, y in a] == [y.tolist() for y in labels0]  # same epoch, same order
    a.set_epoch(1)
    assert [y.tolist() for _, y in a] != [y.tolist() for y in labels0]
    plain = BatchLoader(ds, 20, mean=(0.5,) * 3, std=(0.25,) * 3)
    x, y = next(iter(plain))
    assert torch.allclose(x, (ds.images.float() / 255 - 0.5) / 0.25, atol=1e-5)
    assert torch.equal(y, torch.arange(20))


def test_ddp_slices_reassemble_the_global_batch():
    ds = ArrayDataset(_images(n=24), torch.arange(24))
    kw = dict(mean=(0.5,) * 3, std=(0.2,) * 3, shuffle=True, augment=Augment(pad=2), drop_last=True, seed=1)
    whole = list(BatchLoader(ds, 12, **kw))
    ranks = [list(BatchLoader(ds, 12, rank=r, world_size=2, **kw)) for r in range(2)]
    for step, (x, y) in enumerate(whole):
        assert torch.equal(torch.cat([ranks[0][step][0], ranks[1][step][0]]), x)
        assert torch.equal(torch.cat([ranks[0][step][1], ranks[1][step][1]]), y)


def test_epoch_generator_depends_only_on_seed_and_epoch():
    a = torch.rand(3, generator=epoch_generator(1, 2))
    torch.manual_seed(123)  # global RNG state must not matter
    assert torch.equal(a, torch.rand(3, generator=epoch_generator(1, 2)))


def test_digits_source():
    from sklearn.datasets import load_digits

    bundle = load_data(DataConfig(name="digits", val_split=0.1), seed=0)
    assert (len(bundle.train), len(bundle.val)) == (1617, 180)
    assert (bundle.in_chans, bundle.input_size) == (1, 8)
    assert bundle.class_names == [str(i) for i in range(10)]
    assert bundle.augment == Augment(pad=1, flip=False)
    # normalisation from the training split, by numpy
    train_idx, _ = split_indices(1797, 0.1, 0)
    pixels = np.round(load_digits().images * 255 / 16)[train_idx.numpy()] / 255
    assert bundle.mean[0] == pytest.approx(pixels.mean(), abs=1e-6)
    assert bundle.std[0] == pytest.approx(pixels.std(), abs=1e-6)


def test_npz_source_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.integers(0, 256, (40, 12, 12, 3), dtype=np.uint8), y=np.arange(40) % 4,
             classes=np.array(["a", "b", "c", "d"]))
    bundle = load_data(DataConfig(name="npz", data_dir=str(path), val_split=0.25, limit=10), seed=0)
    assert (len(bundle.train), len(bundle.val)) == (10, 10)
    bundle = load_data(DataConfig(name="npz", data_dir=str(path), val_split=0.5, limit=10), seed=0)
    assert (len(bundle.train), len(bundle.val)) == (10, 20)  # the whole hold-out
    bundle = load_data(DataConfig(name="npz", data_dir=str(path), val_split=0.5, limit=10, val_limit=4), seed=0)
    assert (len(bundle.train), len(bundle.val)) == (10, 4)
    assert bundle.class_names == ["a", "b", "c", "d"]
    assert (bundle.in_chans, bundle.input_size) == (3, 12)
    assert bundle.augment == Augment(pad=1, flip=True)

    np.savez(tmp_path / "nox.npz", y=np.arange(3))
    with pytest.raises(InputError, match=r"missing key\(s\) \['x'\]"):
        load_data(DataConfig(name="npz", data_dir=str(tmp_path / "nox.npz")), seed=0)
    np.savez(tmp_path / "float.npz", x=np.zeros((3, 4, 4, 3), np.float32), y=np.arange(3))
    with pytest.raises(InputError, match="received float32"):
        load_data(DataConfig(name="npz", data_dir=str(tmp_path / "float.npz")), seed=0)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot read"):
        load_data(DataConfig(name="npz", data_dir=str(tmp_path / "junk.npz")), seed=0)
    with pytest.raises(FileNotFoundError):
        load_data(DataConfig(name="npz", data_dir=str(tmp_path / "absent.npz")), seed=0)


def test_cifar_without_data_names_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="--download"):
        load_data(DataConfig(name="cifar10", data_dir=str(tmp_path)), seed=0)


def test_imagefolder_source(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    bundle = load_data(DataConfig(name="imagefolder", data_dir=str(tmp_path), val_split=0.2), seed=0)
    assert bundle.class_names == ["cat", "dog"] and (len(bundle.train), len(bundle.val)) == (8, 2)
    x, y = next(iter(bundle.train_loader(4, seed=0)))
    assert x.shape == (4, 3, 224, 224) and y.shape == (4,)
    xv, _ = next(iter(bundle.eval_loader(bundle.val, 2)))
    assert xv.shape == (2, 3, 224, 224)


def _image_folders(root, splits):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, classes in splits.items():
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / split / cls / f"{i}.png")


def test_a_val_folder_without_one_class_keeps_the_training_labels(tmp_path):
    """train/{ant,bee,cat} and val/{ant,cat}: each folder numbered its own classes, so every val/ "cat" image was
    scored against the model's "bee" output (label 1 in val/, 2 in train/), silently."""
    _image_folders(tmp_path, {"train": ["ant", "bee", "cat"], "val": ["ant", "cat"]})
    bundle = load_data(DataConfig(name="imagefolder", data_dir=str(tmp_path), val_split=0.0), seed=0)
    assert bundle.class_names == ["ant", "bee", "cat"]
    val_labels = {Path(path).parent.name: label for path, label in bundle.val.samples}
    assert val_labels == {"ant": 0, "cat": 2}
    assert sorted({int(bundle.val[i][1]) for i in range(len(bundle.val))}) == [0, 2]


def test_a_val_folder_with_a_class_training_never_saw_is_refused(tmp_path):
    _image_folders(tmp_path, {"train": ["ant", "bee"], "val": ["ant", "bee", "cow"]})
    with pytest.raises(InputError, match=r"val/ has class folders train/ has not: \['cow'\]; expected"):
        load_data(DataConfig(name="imagefolder", data_dir=str(tmp_path), val_split=0.0), seed=0)


def test_a_limit_on_a_train_folder_draws_from_every_class(tmp_path):
    """``data.limit`` on train/ took the first images of the class-sorted list: the first classes only (limit 6 of 3
    classes x 4 images: labels 0 and 1, class 2 never seen). A seeded draw, as the single-folder case's."""
    _image_folders(tmp_path, {"train": ["ant", "bee", "cat"], "val": ["ant", "bee", "cat"]})
    labels = set()
    for seed in range(4):
        bundle = load_data(DataConfig(name="imagefolder", data_dir=str(tmp_path), val_split=0.0, limit=6), seed=seed)
        assert len(bundle.train) == 6
        labels |= {int(bundle.train[i][1]) for i in range(6)}
    assert labels == {0, 1, 2}


def test_shared_cifar10_npz(shared_cifar10):
    bundle = load_data(DataConfig(name="npz", data_dir=str(shared_cifar10), val_split=0.1), seed=0)
    assert (len(bundle.train), len(bundle.val)) == (45000, 5000)
    assert bundle.class_names[:3] == ["airplane", "automobile", "bird"]
    # the published CIFAR-10 statistics (README), from the 45k training part
    assert bundle.mean == pytest.approx((0.4914, 0.4822, 0.4465), abs=2e-3)
    assert bundle.std == pytest.approx((0.2470, 0.2435, 0.2616), abs=2e-3)


def test_cifar_download_without_a_network_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    """Reproduces issue 15: --download offline gave a urllib traceback and left an empty data folder."""
    import urllib.error

    import torchvision.datasets.utils as tv_utils

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(tv_utils, "download_url", offline)
    monkeypatch.setattr("torchvision.datasets.cifar.download_and_extract_archive",
                        lambda *a, **k: offline() or tv_utils.download_and_extract_archive(*a, **k))
    root = tmp_path / "cifar"
    with pytest.raises(InputError, match="--download of cifar10 into .* failed .*URLError.*use --data npz"):
        load_data(DataConfig(name="cifar10", data_dir=str(root), download=True), seed=0)
    assert not root.exists()


def test_npz_class_names_stored_as_bytes_are_text(tmp_path):
    """Class names saved as bytes (dtype 'S': h5py, np.char.encode) became the names "b'cat'", "b'dog'"."""
    x, y = np.zeros((8, 8, 8, 3), np.uint8), np.arange(8) % 2
    np.savez(tmp_path / "bytes.npz", x=x, y=y, classes=np.char.encode(np.array(["cat", "chien é"]), "utf-8"))
    assert load_npz(tmp_path / "bytes.npz")[1] == ["cat", "chien é"]
    np.savez(tmp_path / "latin1.npz", x=x, y=y, classes=np.array([b"cat", b"chien \xe9"]))
    with pytest.raises(InputError, match=r"'classes'\[1\] received b'chien \\xe9', which is not UTF-8 text"):
        load_npz(tmp_path / "latin1.npz")


def test_npz_fingerprint_of_an_array_of_python_objects_is_an_input_error(tmp_path):
    """npz_fingerprint (the demo's check of its file) read x and y outside its error handling: a ValueError."""
    np.savez(tmp_path / "obj.npz", x=np.zeros((4, 8, 8, 3), np.uint8), y=np.arange(4).astype(object))
    with pytest.raises(InputError, match="'y' received an array of Python objects"):
        npz_fingerprint(tmp_path / "obj.npz")


def test_a_16_bit_grayscale_image_trains_as_the_runtime_reads_it(tmp_path):
    """A 16-bit grayscale PNG (mode I;16: medical, scientific cameras) was decoded by torchvision's PIL loader, which
    clips at 255: every pixel above 255 of 65535 white (mean level 0.998), while `hne-edge run` reads the high byte
    (0.499). A model trained on blank images was deployed on real ones; folder images are now read as the runtime
    reads them."""
    from PIL import Image

    from hne_edge.runtime.images import read_image

    for split in ("train", "val"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            Image.fromarray(np.full((256, 256), 32768, np.uint16)).save(tmp_path / split / cls / "0.png")
    bundle = load_data(DataConfig(name="imagefolder", data_dir=str(tmp_path), val_split=0.0), seed=0)
    x, _ = next(iter(bundle.eval_loader(bundle.val, 2)))
    levels = x * torch.tensor(bundle.std).view(1, 3, 1, 1) + torch.tensor(bundle.mean).view(1, 3, 1, 1)
    assert levels.mean().item() == pytest.approx(128 / 255, abs=0.01)
    frames, _ = bundle.frames(bundle.val)
    assert np.array_equal(frames[0], read_image(tmp_path / "val" / "a" / "0.png", 3)[16:240, 16:240])


def test_hidden_files_in_a_class_folder_are_not_images(tmp_path):
    """A macOS AppleDouble file `._0.png` (what unzipping a Mac-made archive leaves) was counted as an image."""
    _image_folders(tmp_path, {"train": ["ant", "bee"]})
    (tmp_path / "train" / "ant" / "._0.png").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")
    bundle = load_data(DataConfig(name="imagefolder", data_dir=str(tmp_path), val_split=0.0), seed=0)
    assert len(bundle.train) == 8
    assert not [path for path, _ in bundle.train.samples if Path(path).name.startswith(".")]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_folder_image_that_does_not_decode_is_one_line_naming_it(tmp_path, workers):
    """A file that does not decode died in a DataLoader worker: an error holding the worker's whole traceback."""
    _image_folders(tmp_path, {"train": ["ant", "bee"]})
    (tmp_path / "train" / "bee" / "bad.png").write_bytes(b"not a png")
    bundle = load_data(DataConfig(name="imagefolder", data_dir=str(tmp_path), val_split=0.0), seed=0)
    with pytest.raises(InputError) as caught:
        list(bundle.train_loader(9, seed=0, num_workers=workers))
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith(f"{tmp_path / 'train' / 'bee' / 'bad.png'}: cannot decode the image"), message
