"""The data formats: .npy, .npz and HDF5 beside text, found by content, read in place when
they can be, and every bad array a one-line exit 3 (app/data/formats/)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from app.config import TrainConfig
from app.data.formats import textfile
from app.data.formats.base import Shape
from app.data.formats.detect import features_array, kind, open_array
from app.data.formats.sources import ROLES
from app.errors import ConfigError, DataError
from tests.conftest import TINY_TRAIN_ARGS, events, json_lines, popen_cli, prepare_cache, run_cli


def _arrays(text_dir: Path) -> dict[str, np.ndarray]:
    """The four text files of ``text_dir`` as the float32 arrays the parser gives."""
    return {
        role: np.concatenate(list(textfile.iter_chunks(text_dir / f"{role}.txt"))) for role in ROLES
    }


@pytest.fixture(scope="module")
def arrays(tiny_data: Path) -> dict[str, np.ndarray]:
    return _arrays(tiny_data)


def _npy_dir(path: Path, arrays: dict[str, np.ndarray], **replace: np.ndarray) -> Path:
    """A data directory of four .npy files (features as (n, 20, 195)); ``replace``: other
    arrays for some roles."""
    path.mkdir(parents=True, exist_ok=True)
    for role, a in {**arrays, **replace}.items():
        out = a.reshape(len(a), 20, 195) if "features" in role and role not in replace else a
        np.save(path / f"{role}.npy", out, allow_pickle=role in replace and a.dtype == object)
    return path


def _h5(path: Path, arrays: dict[str, np.ndarray], chunked: tuple[str, ...] = ()) -> Path:
    with h5py.File(path, "w") as f:
        for role, a in arrays.items():
            if role in chunked:
                f.create_dataset(role, data=a, chunks=(7, *a.shape[1:]), compression="gzip")
            else:
                f.create_dataset(role, data=a)
    return path


def _train(data: Path, out: Path, *extra: str) -> tuple[int, list[str], list[dict]]:
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--max-steps", "1", *extra,
        *TINY_TRAIN_ARGS,
    )  # fmt: skip
    return proc.returncode, proc.stderr.splitlines(), json_lines(proc.stdout)


# --- found by content ------------------------------------------------------------------------


def test_the_format_is_told_by_content_not_by_name(tmp_path: Path, arrays: dict) -> None:
    a = arrays["train_labels"]
    np.save(tmp_path / "x.npy", a)
    shutil.copy(tmp_path / "x.npy", tmp_path / "labels.txt")  # a .npy under a text name
    np.savez(tmp_path / "x.npz", train_labels=a)
    shutil.copy(tmp_path / "x.npz", tmp_path / "archive.dat")
    _h5(tmp_path / "x.hdf", {"train_labels": a})
    (tmp_path / "t.npy").write_bytes(b"1 2 3\n4 5 6\n")  # text under a .npy name
    assert [kind(tmp_path / n) for n in ("labels.txt", "archive.dat", "x.hdf", "t.npy")] == [
        "npy", "npz", "hdf5", "text",
    ]  # fmt: skip
    got = np.concatenate(list(open_array(tmp_path / "labels.txt").chunks(Shape(3), False)))
    np.testing.assert_array_equal(got, a)


def test_an_hdf5_file_behind_a_user_block_is_recognised(tmp_path: Path, arrays: dict) -> None:
    path = tmp_path / "blocked.h5"
    with h5py.File(path, "w", userblock_size=1024) as f:
        f.create_dataset("train_labels", data=arrays["train_labels"])
    assert kind(path) == "hdf5"
    assert open_array(path, "train_labels").columns(10) == 3


def test_npy_files_are_found_by_their_default_names(tmp_path: Path, arrays: dict) -> None:
    data = _npy_dir(tmp_path / "d", arrays)
    config = TrainConfig.of(data_dir=data, output_dir=tmp_path / "o")
    from app.training.admit.sources import find

    found = find(config.data)
    assert {r: found.path(r).name for r in ROLES} == {r: f"{r}.npy" for r in ROLES}


# --- read in place ----------------------------------------------------------------------------


def test_a_float32_npy_is_used_in_place_with_the_texts_digests(
    tmp_path: Path, tiny_data: Path, arrays: dict
) -> None:
    """No array of a float32 .npy is copied into the cache; its rows, statistics and
    digests are the ones the text gives."""
    data = _npy_dir(tmp_path / "npy", arrays)
    text = prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "t"))
    npy = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp_path / "n"))
    assert sorted(p.name for p in npy.path.iterdir()) == [
        ".coretrain",
        "manifest.json",
        "stats.npz",
    ]
    assert npy.where("train_x.f32") == (data.resolve() / "train_features.npy", 128)
    assert npy.checksums == text.checksums
    assert (npy.fingerprint("train"), npy.fingerprint("test")) == (
        text.fingerprint("train"), text.fingerprint("test"),
    )  # fmt: skip
    for stat in ("feature_mean", "feature_std", "label_mean", "label_std"):
        np.testing.assert_array_equal(getattr(npy, stat), getattr(text, stat))
    np.testing.assert_array_equal(npy.features("train"), text.features("train"))
    idx = np.array([0, 1, 2, 17, 100, 239])
    np.testing.assert_array_equal(
        npy.read_rows("train", "features", idx), text.read_rows("train", "features", idx)
    )
    manifest = json.loads((npy.path / "manifest.json").read_text())
    assert set(manifest["in_place"]) == {"train_x.f32", "train_y.f32", "test_x.f32", "test_y.f32"}


@pytest.mark.parametrize("dtype", ["float64", "float16", "int32", "uint8", ">f4"])
def test_other_real_dtypes_are_converted_once(tmp_path: Path, arrays: dict, dtype: str) -> None:
    feats = arrays["train_features"].astype(dtype)
    data = _npy_dir(tmp_path / "d", arrays, train_features=feats)
    cache = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp_path / "o"))
    assert (cache.path / "train_x.f32").stat().st_size == feats.size * 4
    np.testing.assert_array_equal(
        cache.features("train").reshape(len(feats), -1), feats.astype(np.float32)
    )
    written = (cache.path / "train_x.f32").read_bytes()  # digested as it was written
    assert cache.checksums["train_x.f32"] == hashlib.blake2b(written, digest_size=32).hexdigest()


def test_a_fortran_ordered_npy_is_converted_not_mapped(tmp_path: Path, arrays: dict) -> None:
    feats = np.asfortranarray(arrays["train_features"])
    data = _npy_dir(tmp_path / "d", arrays, train_features=feats)
    cache = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp_path / "o"))
    assert (cache.path / "train_x.f32").is_file()
    np.testing.assert_array_equal(cache.features("train").reshape(len(feats), -1), feats)


def test_hdf5_chunked_compressed_is_read_in_blocks_contiguous_in_place(
    tmp_path: Path, arrays: dict
) -> None:
    path = _h5(tmp_path / "d.h5", arrays, chunked=("train_features",))
    cache = prepare_cache(TrainConfig.of(data_dir=path, output_dir=tmp_path / "o"))
    assert (cache.path / "train_x.f32").is_file()  # compressed: converted
    assert not (cache.path / "test_x.f32").exists()  # contiguous float32: in place
    np.testing.assert_array_equal(cache.features("test").reshape(60, -1), arrays["test_features"])
    np.testing.assert_array_equal(
        cache.features("train").reshape(240, -1), arrays["train_features"]
    )


def _linked(tmp_path: Path, arrays: dict) -> Path:
    """An HDF5 data file whose training labels are an external link into another: the
    container holds other bytes where the linked dataset lies in its own file."""
    _h5(tmp_path / "all.h5", arrays)
    path = tmp_path / "linked.h5"
    with h5py.File(path, "w") as f:
        for role in ("test_features", "test_labels", "train_features"):
            f.create_dataset(role, data=arrays[role])
        f["train_labels"] = h5py.ExternalLink("all.h5", "/train_labels")
    return path


def test_an_hdf5_dataset_in_another_file_is_read_from_there_not_in_place(
    tmp_path: Path, arrays: dict
) -> None:
    path = _linked(tmp_path, arrays)
    cache = prepare_cache(TrainConfig.of(data_dir=path, output_dir=tmp_path / "o"))
    manifest = json.loads((cache.path / "manifest.json").read_text())
    assert "train_y.f32" not in manifest["in_place"]  # its offset is in all.h5
    assert "train_x.f32" in manifest["in_place"]
    np.testing.assert_array_equal(cache.labels("train"), arrays["train_labels"])


@pytest.mark.parametrize("how", ["external link", "external storage", "virtual"])
def test_a_change_to_an_hdf5_dataset_kept_in_another_file_changes_the_cache_key(
    tmp_path: Path, arrays: dict, how: str
) -> None:
    from app.data.cache.entry import source_key
    from app.data.formats.sources import Sources

    labels = arrays["train_labels"]
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        for role in ("test_features", "test_labels", "train_features"):
            f.create_dataset(role, data=arrays[role])
        if how == "external link":
            with h5py.File(tmp_path / "src.h5", "w") as src:
                src["y"] = labels
            f["train_labels"] = h5py.ExternalLink("src.h5", "/y")
        elif how == "external storage":
            labels.tofile(tmp_path / "labels.raw")
            raw = [(str(tmp_path / "labels.raw"), 0, labels.nbytes)]
            f.create_dataset("train_labels", shape=labels.shape, dtype="<f4", external=raw)
        else:
            with h5py.File(tmp_path / "src.h5", "w") as src:
                src["y"] = labels
            layout = h5py.VirtualLayout(shape=labels.shape, dtype="<f4")
            layout[:] = h5py.VirtualSource(str(tmp_path / "src.h5"), "y", shape=labels.shape)
            f.create_virtual_dataset("train_labels", layout)
    sources = Sources({role: path for role in ROLES}, 20, 195, members={r: r for r in ROLES})
    before = source_key(sources)
    assert source_key(sources) == before  # the same values: the same key
    changed = labels * 10
    if how == "external storage":
        changed.astype("<f4").tofile(tmp_path / "labels.raw")
    else:
        with h5py.File(tmp_path / "src.h5", "r+") as src:
            src["y"][...] = changed
    with h5py.File(path, "r") as f:  # what a reader of the container now gets
        np.testing.assert_array_equal(f["train_labels"][...], changed)
    assert source_key(sources) != before


def _grouped(path: Path, arrays: dict, groups: tuple[str, ...] = ("data",)) -> Path:
    """An HDF5 file with the four arrays in each of ``groups`` (as another program writes
    them: ``data/train_features``, …)."""
    with h5py.File(path, "w") as f:
        for group in groups:
            for role, a in arrays.items():
                f.create_dataset(f"{group}/{role}", data=a)
    return path


def test_hdf5_datasets_in_a_group_are_found_by_their_names_or_paths(
    tmp_path: Path, arrays: dict
) -> None:
    path = _grouped(tmp_path / "g.h5", arrays)
    cache = prepare_cache(TrainConfig.of(data_dir=path, output_dir=tmp_path / "o"))
    np.testing.assert_array_equal(cache.labels("train"), arrays["train_labels"])
    manifest = json.loads((cache.path / "manifest.json").read_text())
    assert "train_x.f32" in manifest["in_place"]  # contiguous float32 in a group: in place
    named = TrainConfig.of(
        data_dir=path, output_dir=tmp_path / "o2", train_labels="/data/train_labels",
        test_labels="data/test_labels",
    )  # fmt: skip
    np.testing.assert_array_equal(prepare_cache(named).labels("test"), arrays["test_labels"])
    got = features_array(path).chunks(Shape(3900), False)
    np.testing.assert_array_equal(np.concatenate(list(got)), arrays["test_features"])


def test_a_bare_name_two_hdf5_datasets_end_in_is_exit_2_naming_both(
    tmp_path: Path, arrays: dict
) -> None:
    path = _grouped(tmp_path / "g.h5", arrays, groups=("a", "b"))
    with pytest.raises(ConfigError) as caught:
        open_array(path, "train_labels")
    assert str(caught.value) == (
        f"{path}: 2 datasets are named train_labels (a/train_labels, b/train_labels): name "
        "the one to read by its path in the file"
    )
    assert open_array(path, "b/train_labels").label == f"{path}:b/train_labels"
    with pytest.raises(DataError, match=r"g\.h5:c/train_labels: no such dataset in the HDF5 "
                       r"file \(it holds: a/test_features, "):  # fmt: skip
        open_array(path, "c/train_labels")


def test_hdf5_links_in_groups_and_hard_links_are_datasets_by_each_name(
    tmp_path: Path, arrays: dict
) -> None:
    """As other programs lay files out: a group of soft links to the raw datasets, a group
    of external links into another file, the same dataset under a second name."""
    _grouped(tmp_path / "raw.h5", arrays, groups=("store",))
    path = tmp_path / "linked.h5"
    with h5py.File(path, "w") as f:
        for role, a in arrays.items():
            f.create_dataset(f"raw/{role}_x", data=a)
            f[f"soft/{role}"] = h5py.SoftLink(f"/raw/{role}_x")
            f[f"ext/{role}"] = h5py.ExternalLink("raw.h5", f"/store/{role}")
        f["backup/labels_copy"] = f["raw/train_labels_x"]  # a hard link
        f["soft/dangling"] = h5py.SoftLink("/nowhere")
    for name in ("soft/train_labels", "ext/train_labels", "backup/labels_copy"):
        got = np.concatenate(list(open_array(path, name).chunks(Shape(3), False)))
        np.testing.assert_array_equal(got, arrays["train_labels"])
    with pytest.raises(ConfigError, match=r"2 datasets are named test_labels \(ext/test_labels,"
                       r" soft/test_labels\)"):  # fmt: skip
        open_array(path, "test_labels")


def test_a_broken_hdf5_dataset_the_run_does_not_read_is_not_read(
    tmp_path: Path, arrays: dict
) -> None:
    """An unused dataset kept in an external raw file that is gone: the run reads the four
    it names (their key included), never that one."""
    path = _grouped(tmp_path / "d.h5", arrays)
    with h5py.File(path, "a") as f:
        raw = [(str(tmp_path / "gone.raw"), 0, 12)]
        f.create_dataset("aux/calib", shape=(3,), dtype="<f4", external=raw)
    cache = prepare_cache(TrainConfig.of(data_dir=path, output_dir=tmp_path / "o"))
    np.testing.assert_array_equal(cache.labels("train"), arrays["train_labels"])


def test_a_virtual_hdf5_dataset_whose_source_is_gone_is_exit_3_not_fill_values(
    tmp_path: Path, arrays: dict
) -> None:
    labels = arrays["train_labels"]
    with h5py.File(tmp_path / "src.h5", "w") as src:
        src["y"] = labels
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        layout = h5py.VirtualLayout(shape=labels.shape, dtype="<f4")
        layout[:] = h5py.VirtualSource("src.h5", "y", shape=labels.shape)
        f.create_virtual_dataset("data/train_labels", layout)
    got = np.concatenate(list(open_array(path, "train_labels").chunks(Shape(3), False)))
    np.testing.assert_array_equal(got, labels)  # found beside the file
    with h5py.File(tmp_path / "src.h5", "a") as src:
        src.move("y", "y_renamed")
    with pytest.raises(DataError) as caught:
        open_array(path, "train_labels")
    assert str(caught.value) == (
        f"{path}:data/train_labels: a virtual dataset whose source src.h5:y is not there "
        "(HDF5 would read its fill value in its place)"
    )
    (tmp_path / "src.h5").rename(tmp_path / "moved.h5")
    with pytest.raises(DataError) as caught:
        open_array(path, "train_labels")
    assert str(caught.value) == (
        f"{path}:data/train_labels: a virtual dataset whose source src.h5 is not there "
        "(HDF5 would read its fill value in its place)"
    )


def test_a_container_of_many_arrays_is_named_in_a_bounded_message(tmp_path: Path) -> None:
    path = tmp_path / "many.h5"
    with h5py.File(path, "w") as f:
        for i in range(30):
            f.create_dataset(f"g/a{i:02d}", data=np.zeros(2, np.float32))
    with pytest.raises(DataError) as caught:
        open_array(path, "nothere")
    shown = ", ".join(f"g/a{i:02d}" for i in range(20))
    assert str(caught.value) == (
        f"{path}:nothere: no such dataset in the HDF5 file (it holds: {shown}, … (10 more))"
    )


def test_a_grouped_hdf5_dataset_kept_in_another_file_is_in_the_cache_key(
    tmp_path: Path, arrays: dict
) -> None:
    from app.data.cache.entry import source_key
    from app.data.formats.sources import Sources

    labels = arrays["train_labels"]
    labels.tofile(tmp_path / "labels.raw")
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        for role in ("test_features", "test_labels", "train_features"):
            f.create_dataset(f"data/{role}", data=arrays[role])
        raw = [(str(tmp_path / "labels.raw"), 0, labels.nbytes)]
        f.create_dataset("data/train_labels", shape=labels.shape, dtype="<f4", external=raw)
    sources = Sources({role: path for role in ROLES}, 20, 195, members={r: r for r in ROLES})
    before = source_key(sources)
    (labels * 10).astype("<f4").tofile(tmp_path / "labels.raw")
    assert source_key(sources) != before


def test_predict_refuses_to_guess_between_two_features_arrays(tmp_path: Path, arrays: dict) -> None:
    a = arrays["test_features"]
    path = _grouped(tmp_path / "two.h5", {"features": a, "test_features": a}, ("a", "b"))
    with pytest.raises(ConfigError, match=r"2 arrays are named features \(a/features, b/feat"):
        features_array(path)
    with h5py.File(tmp_path / "none.h5", "w") as f:
        f.create_group("empty")
    with pytest.raises(DataError, match="no array named features or test_features, and no arr"):
        features_array(tmp_path / "none.h5")


def test_predict_picks_a_containers_features_array(tmp_path: Path, arrays: dict) -> None:
    a = arrays["test_features"]
    np.savez(tmp_path / "one.npz", anything=a)
    np.savez(tmp_path / "two.npz", test_features=a, test_labels=arrays["test_labels"])
    np.savez(tmp_path / "many.npz", x=a, y=a)
    for name in ("one.npz", "two.npz"):
        got = np.concatenate(list(features_array(tmp_path / name).chunks(Shape(3900), False)))
        np.testing.assert_array_equal(got, a)
    with pytest.raises(DataError, match=r"many\.npz: no array named features"):
        features_array(tmp_path / "many.npz")


# --- bad arrays: exit 3, one line naming the file (and array) --------------------------------


def _bad_cases(tmp: Path, arrays: dict) -> dict[str, tuple[Path, str]]:
    """name → (--data, what the one line must hold after ``coretrain: ``)."""
    feats, labels = arrays["train_features"], arrays["train_labels"]
    cases: dict[str, tuple[Path, str]] = {}

    def npy(name: str, expect: str, **replace: np.ndarray) -> None:
        cases[name] = (_npy_dir(tmp / name, arrays, **replace), expect)

    d = str(tmp)
    npy(
        "width",
        f"{d}/width/train_features.npy: shape (240, 100), expected",
        train_features=feats[:, :100],
    )
    npy("shape", f"{d}/shape/train_features.npy: shape (240, 20, 195, 2)",
        train_features=np.repeat(feats.reshape(240, 20, 195, 1), 2, axis=3))  # fmt: skip
    npy("labels3d", f"{d}/labels3d/train_labels.npy: shape (240, 3, 1): labels are",
        train_labels=labels.reshape(240, 3, 1))  # fmt: skip
    npy("object", f"{d}/object/train_labels.npy: object dtype", train_labels=labels.astype(object))
    npy("structured", f"{d}/structured/train_labels.npy: structured dtype",
        train_labels=np.zeros(240, [("a", "f4"), ("b", "f4"), ("c", "f4")]))  # fmt: skip
    npy("complex", f"{d}/complex/train_labels.npy: dtype complex64, not real numbers",
        train_labels=labels.astype(np.complex64))  # fmt: skip
    nan = feats.copy()
    nan[17, 5] = np.nan
    npy("nonfinite", f"{d}/nonfinite/train_features.npy: row 18, column 6: nan", train_features=nan)
    npy("rows", f"{d}/rows/train_labels.npy: 239 label rows but {d}/rows/train_features.npy",
        train_labels=labels[:239])  # fmt: skip
    npy("empty", f"{d}/empty/train_labels.npy: empty array", train_labels=labels[:0])
    small = np.array([{"x": 1}] * 240, dtype=object)  # its pickle: far fewer than 240 × 8 bytes
    npy("small_pickle", f"{d}/small_pickle/train_labels.npy: object dtype (pickled Python "
        "objects are never read)", train_labels=small)  # fmt: skip
    npy("negative", f"{d}/negative/train_labels.npy: shape (-240, 3): a negative length")
    path = tmp / "negative" / "train_labels.npy"
    path.write_bytes(path.read_bytes().replace(b"(240, 3)", b"(-240, 3)", 1))
    npy("truncated", f"{d}/truncated/train_features.npy: truncated")
    path = tmp / "truncated" / "train_features.npy"
    path.write_bytes(path.read_bytes()[:-1000])
    np.savez(tmp / "cut.npz", **arrays)
    raw = (tmp / "cut.npz").read_bytes()
    (tmp / "cut.npz").write_bytes(raw[: len(raw) // 2])
    cases["npz_truncated"] = (tmp / "cut.npz", f"{d}/cut.npz: not a readable .npz")
    np.savez(tmp / "missing.npz", **{r: a for r, a in arrays.items() if r != "test_labels"})
    cases["npz_missing"] = (tmp / "missing.npz", f"{d}/missing.npz:test_labels: no such array")
    np.savez(tmp / "twice.npz", **arrays)
    with warnings.catch_warnings(), zipfile.ZipFile(tmp / "twice.npz", "a") as zf:
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name": it writes it all the same
        with zf.open("train_labels.npy", "w") as member:
            np.save(member, np.zeros_like(labels))  # read in place of the first: all zeros
    cases["npz_twice"] = (
        tmp / "twice.npz",
        f"{d}/twice.npz:train_labels: 2 members of the zip are named train_labels.npy (which "
        "one is meant can't be known): save the .npz again with one",
    )
    mixed = {**arrays, "test_features": arrays["test_features"][:59]}
    cases["h5_rows"] = (_h5(tmp / "rows.h5", mixed), f"{d}/rows.h5:test_labels: 60 label rows")
    _h5(tmp / "cut.h5", arrays)
    raw = (tmp / "cut.h5").read_bytes()
    (tmp / "cut.h5").write_bytes(raw[: len(raw) // 3])
    cases["h5_truncated"] = (tmp / "cut.h5", f"{d}/cut.h5")
    return cases


BAD = [
    "width", "shape", "labels3d", "object", "small_pickle", "structured", "complex", "nonfinite",
    "rows", "empty", "negative", "truncated", "npz_truncated", "npz_missing", "npz_twice",
    "h5_rows", "h5_truncated",
]  # fmt: skip


@pytest.fixture(scope="module")
def bad_cases(tmp_path_factory: pytest.TempPathFactory, arrays: dict) -> dict:
    return _bad_cases(tmp_path_factory.mktemp("bad"), arrays)


@pytest.mark.parametrize("case", BAD)
def test_a_bad_array_is_exit_3_in_one_line(tmp_path: Path, bad_cases: dict, case: str) -> None:
    data, expect = bad_cases[case]
    code, lines, records = _train(data, tmp_path / "o")
    assert code == 3, lines
    assert len(lines) == 1 and lines[0].startswith(f"coretrain: {expect}"), lines
    assert "Traceback" not in "\n".join(lines)
    assert events(records, "end")[-1]["exit_code"] == 3


def test_allow_nonfinite_admits_nan_in_an_array(tmp_path: Path, bad_cases: dict) -> None:
    """As for text: admitted, the NaN reaches the statistics, which is the next refusal."""
    data, _ = bad_cases["nonfinite"]
    code, lines, _ = _train(data, tmp_path / "o", "--allow-nonfinite")
    assert code == 3 and len(lines) == 1
    assert "NaN/Inf values (allowed by --allow-nonfinite) make the standardisation" in lines[0]


def test_the_cache_bound_applies_to_a_converted_array_not_to_one_in_place(
    tmp_path: Path, arrays: dict
) -> None:
    wide = _npy_dir(tmp_path / "f64", arrays, train_features=arrays["train_features"].astype("f8"))
    code, lines, _ = _train(wide, tmp_path / "o1", "--max-cache-bytes", "1000000")
    assert code == 3 and len(lines) == 1
    assert lines[0].startswith(f"coretrain: {wide}/train_features.npy: the data cache would take")
    in_place = _npy_dir(tmp_path / "f32", arrays)
    config = TrainConfig.of(data_dir=in_place, output_dir=tmp_path / "o2", max_cache_bytes=100_000)
    assert prepare_cache(config, max_bytes=100_000).train_size == 240


def test_a_labels_array_with_too_many_columns_is_refused_from_its_header(
    tmp_path: Path, arrays: dict
) -> None:
    data = _npy_dir(tmp_path / "d", arrays, train_labels=np.zeros((240, 10_001), np.float32))
    code, lines, _ = _train(data, tmp_path / "o")
    assert code == 3 and len(lines) == 1
    assert lines[0] == (
        f"coretrain: {data}/train_labels.npy: more than 10000 label columns (the limit, "
        "app/data/cache/bounds.py): not a label file?"
    )


# --- the same values train the same model, whatever the format --------------------------------


@pytest.mark.slow
def test_text_npy_npz_and_hdf5_train_to_the_same_test_rmse_bit_for_bit(
    tmp_path: Path, tiny_data: Path, arrays: dict
) -> None:
    """Same seed, formulation and precision (tests/conftest.py PINNED): the same values give
    the same cache statistics and digests, so the same run identity, batches and weights;
    ``predict`` gives the same predictions from each format."""
    chunked = ("train_features", "test_features")
    inputs = {
        "text": tiny_data,
        "npy": _npy_dir(tmp_path / "npy", arrays),
        "npz": tmp_path / "d.npz",
        "hdf5": _h5(tmp_path / "d.h5", arrays, chunked=chunked),
    }
    np.savez_compressed(inputs["npz"], **arrays)
    metrics, identity = {}, {}
    for name, data in inputs.items():
        out = tmp_path / f"out-{name}"
        code, lines, _ = _train(data, out, "--max-steps", "6", "--seed", "5")
        assert code == 0, lines
        metrics[name] = json.loads((out / "metrics.json").read_text())
        identity[name] = json.loads((out / "checkpoints" / "run.json").read_text())["data"]
    for name in ("npy", "npz", "hdf5"):
        assert identity[name] == identity["text"]
        for key in ("test_rmse", "val_rmse", "baseline_rmse", "linear_rmse"):
            assert metrics[name][key] == metrics["text"][key], (name, key)
    model = tmp_path / "out-text" / "model"
    predicted = []
    for name, features in (
        ("text", tiny_data / "test_features.txt"),
        ("npy", inputs["npy"] / "test_features.npy"),
        ("npz", inputs["npz"]),
        ("hdf5", inputs["hdf5"]),
    ):
        out = tmp_path / f"p-{name}.npy"
        proc = run_cli(
            "predict", "--model", str(model), "--features", str(features), "--out", str(out)
        )
        assert proc.returncode == 0, proc.stderr
        predicted.append(np.load(out))
    for got in predicted[1:]:
        np.testing.assert_array_equal(got, predicted[0])
    # The export records its H×W: (n, W, H) has as many values a row but is refused.
    record = json.loads((model / "saved_model/assets.extra/coretrain_input.json").read_text())
    assert record == {"height": 20, "width": 195, "outputs": 3}
    wh = tmp_path / "wh.npy"
    np.save(wh, arrays["test_features"].reshape(-1, 20, 195).transpose(0, 2, 1))
    proc = run_cli("predict", "--model", str(model), "--features", str(wh), "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == (
        f"coretrain: {wh}: shape (60, 195, 20), expected (n, 3900), (n, 20, 195) or "
        "(n, 20, 195, 1) (the model takes H×W = 20×195 features)"
    )


def test_a_containers_arrays_may_be_named_by_option(tmp_path: Path, arrays: dict) -> None:
    from app.training.admit.sources import find

    renamed = {"X": arrays["train_features"], **{r: arrays[r] for r in ROLES[1:]}}
    np.savez(tmp_path / "d.npz", **renamed)
    config = TrainConfig.of(
        data_dir=tmp_path / "d.npz", output_dir=tmp_path / "o", train_features="X"
    )
    found = find(config.data)
    assert [found.label(r) for r in ROLES] == [
        f"{tmp_path}/d.npz:{name}" for name in ("X", *ROLES[1:])
    ]
    assert prepare_cache(config).train_size == 240


def test_an_array_read_in_place_and_changed_while_training_is_not_exported(
    tmp_path: Path, arrays: dict
) -> None:
    """A producer rewrites the labels .npy the run reads where it lies: the model would be
    trained on a mixture, so it is not exported (exit 3) and the checkpoints stay."""

    data, out = _npy_dir(tmp_path / "npy", arrays), tmp_path / "out"
    proc = popen_cli(
        "train", "--data", str(data), "--output", str(out), "--max-steps", "600",
        "--batch-size", "40", "--eval-every", "500", "--checkpoint-every", "3",
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if '"event": "checkpoint"' in line:  # training: the producer writes now
            labels = np.load(data / "train_labels.npy", mmap_mode="r+")
            labels[:] *= 100
            labels.flush()
            del labels
            break
    lines += proc.stdout.readlines()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=600) == 3, stderr[-2000:]
    (line,) = stderr.splitlines()
    assert line == (
        f"coretrain: {(data / 'train_labels.npy').resolve()}: changed while this run trained "
        "on it where it lies (not a copy): the model is not exported and the checkpoints are "
        "kept; train on the new data into a new --output"
    )
    assert list((out / "checkpoints").glob("ckpt-*.index"))  # kept
    assert not (out / "model").exists() and not (out / "metrics.json").exists()
    records = json_lines("".join(lines))
    assert events(records, "end")[-1]["exit_code"] == 3


# --- HDF5's own opens: external links, external storage, virtual sources ----------------------


def _pointing_at(tmp_path: Path, arrays: dict, how: str, target: str) -> Path:
    """An HDF5 data file whose training labels lie in ``target`` (a FIFO, /dev/zero) by
    ``how``: an external link, external raw storage or a virtual dataset's source."""
    labels = arrays["train_labels"]
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        for role in ("test_features", "test_labels", "train_features"):
            f.create_dataset(role, data=arrays[role])
        if how == "external link":
            f["train_labels"] = h5py.ExternalLink(target, "/y")
        elif how == "external storage":
            raw = [(target, 0, labels.nbytes)]
            f.create_dataset("train_labels", shape=labels.shape, dtype="<f4", external=raw)
        else:
            layout = h5py.VirtualLayout(shape=labels.shape, dtype="<f4")
            layout[:] = h5py.VirtualSource(target, "y", shape=labels.shape)
            f.create_virtual_dataset("train_labels", layout)
    return path


#: How each of HDF5's files names the dataset it serves, in the message.
_WHAT = {
    "external link": "the file of HDF5 external link {path}:train_labels",
    "external storage": "the external raw data file of HDF5 dataset {path}:train_labels",
    "virtual": "the source file of HDF5 virtual dataset {path}:train_labels",
}


def _refused_where_the_run_reads(path: Path, expected: str) -> None:
    """Both the run's key (the fingerprint) and the array refuse the training labels of the
    HDF5 file ``path`` with the message ``expected``."""
    from app.data.formats.sources import fingerprint

    for read in (
        lambda: fingerprint(path, ["train_labels"]),
        lambda: open_array(path, "train_labels"),
    ):
        with pytest.raises(DataError) as caught:
            read()
        assert str(caught.value) == expected


@pytest.mark.parametrize("how", sorted(_WHAT))
@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_hdf5_data_in_a_fifo_or_a_device_is_refused_before_hdf5_opens_it(
    tmp_path: Path, arrays: dict, how: str, target: str
) -> None:
    """HDF5 opens these files by name itself: a FIFO made it wait for a writer (the run held
    its output lock), /dev/zero trained on zeros. Each is checked as a data file is first,
    wherever the run reads: the key, the array, the rows."""
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    path = _pointing_at(tmp_path, arrays, how, target)
    kind = "a FIFO (named pipe)" if "fifo" in target else "a character device"
    expected = f"{target}: {_WHAT[how].format(path=path)} is {kind}, not a regular file"
    _refused_where_the_run_reads(path, expected)


def test_a_run_on_hdf5_external_storage_on_dev_zero_is_exit_3_not_trained_on_zeros(
    tmp_path: Path, arrays: dict
) -> None:
    path = _pointing_at(tmp_path, arrays, "external storage", "/dev/zero")
    code, stderr, records = _train(path, tmp_path / "out")
    assert code == 3
    assert stderr == [
        f"coretrain: /dev/zero: {_WHAT['external storage'].format(path=path)} is a character "
        "device, not a regular file"
    ]
    assert events(records, "end")[-1]["exit_code"] == 3


# --- HDF5 external raw files that lack bytes: HDF5 reads zeros for them ---------------------


@pytest.mark.parametrize("held", [0, 1440])
def test_hdf5_external_storage_shorter_than_its_segment_is_refused_naming_what_it_lacks(
    tmp_path: Path, arrays: dict, held: int
) -> None:
    """An empty or half-written external raw file: HDF5 reads zeros for the bytes it lacks
    (H5D__efl_read) and the run trained on them, exit 0."""
    raw = tmp_path / "labels.raw"
    raw.write_bytes(arrays["train_labels"].astype("<f4").tobytes()[:held])
    path = _pointing_at(tmp_path, arrays, "external storage", str(raw))
    expected = (
        f"{raw}: {_WHAT['external storage'].format(path=path)} holds {held:,} bytes, "
        f"{2880 - held:,} fewer than its segment needs (2,880 bytes of values from byte 0): "
        "HDF5 would read zeros in their place"
    )
    _refused_where_the_run_reads(path, expected)
    if held == 0:
        code, stderr, records = _train(path, tmp_path / "out")
        assert (code, stderr) == (3, [f"coretrain: {expected}"])
        assert events(records, "end")[-1]["exit_code"] == 3


def test_each_hdf5_external_segment_needs_the_bytes_of_values_it_holds_from_its_offset(
    tmp_path: Path, arrays: dict
) -> None:
    """Two segments, the second from byte 8 and declared unlimited: each file must hold
    its offset plus the values it holds, no more; a byte less is refused."""
    labels = arrays["train_labels"].astype("<f4")
    values = labels.tobytes()
    (tmp_path / "a.raw").write_bytes(values[:1000])
    (tmp_path / "b.raw").write_bytes(b"\0" * 8 + values[1000:])
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        raw = [(str(tmp_path / "a.raw"), 0, 1000), (str(tmp_path / "b.raw"), 8, h5py.h5f.UNLIMITED)]
        f.create_dataset(
            "train_labels", shape=labels.shape, maxshape=(None, 3), dtype="<f4", external=raw
        )
    got = np.concatenate(list(open_array(path, "train_labels").chunks(Shape(3), False)))
    np.testing.assert_array_equal(got, labels)
    (tmp_path / "b.raw").write_bytes(b"\0" * 8 + values[1000:-1])
    with pytest.raises(DataError) as caught:
        open_array(path, "train_labels")
    assert str(caught.value) == (
        f"{tmp_path / 'b.raw'}: the external raw data file of HDF5 dataset {path}:train_labels "
        "holds 1,887 bytes, 1 fewer than its segment needs (1,880 bytes of values from byte "
        "8): HDF5 would read zeros in their place"
    )


def test_hdf5_external_storage_cut_short_while_its_rows_are_read_is_its_error(
    tmp_path: Path, arrays: dict
) -> None:
    """HDF5 opens the file at each read: one cut short after the first rows were read gives
    zeros for the rest, unless it is checked again after each read."""
    raw = tmp_path / "labels.raw"
    labels = arrays["train_labels"].astype("<f4")
    raw.write_bytes(labels.tobytes())
    path = _pointing_at(tmp_path, arrays, "external storage", str(raw))
    rows = open_array(path, "train_labels").chunks(Shape(3), False, chunk_rows=16)
    np.testing.assert_array_equal(next(rows), labels[:16])
    os.truncate(raw, 100)
    with pytest.raises(DataError) as caught:
        next(rows)
    assert str(caught.value) == (
        f"{raw}: {_WHAT['external storage'].format(path=path)}, truncated to 100 bytes (its "
        "rows need 2,880) while this run read it: rerun once the file is complete"
    )


# --- HDF5 virtual datasets whose sources lead back to them: HDF5 crashes reading them --------


def _virtual(path: Path, name: str, shape: tuple[int, ...], *sources: tuple[str, str]) -> None:
    """Add to the HDF5 file ``path`` the float32 virtual dataset ``name`` of ``shape``, its
    rows split evenly among ``sources`` (file name, dataset), each read from the same rows."""
    layout = h5py.VirtualLayout(shape=shape, dtype="<f4")
    step = shape[0] // len(sources)
    for i, (file, dataset) in enumerate(sources):
        rows = slice(i * step, (i + 1) * step)
        layout[rows] = h5py.VirtualSource(file, dataset, shape=shape)[rows]
    with h5py.File(path, "a") as f:
        f.create_virtual_dataset(name, layout)


def _refuses(path: Path, name: str, expected: str) -> None:
    """Opening the array ``name`` of ``path`` is refused with the message ``expected``."""
    with pytest.raises(DataError) as caught:
        open_array(path, name)
    assert str(caught.value) == expected


def test_an_hdf5_virtual_dataset_that_is_its_own_source_is_exit_3_not_a_crash(
    tmp_path: Path, arrays: dict
) -> None:
    """HDF5 1.14 follows the source into itself until the process dies (SIGSEGV, exit 139,
    h5py alone too): refused from its sources before HDF5 reads a value."""
    path = _h5(tmp_path / "d.h5", {r: a for r, a in arrays.items() if r != "train_labels"})
    _virtual(path, "train_labels", arrays["train_labels"].shape, (".", "train_labels"))
    expected = (
        f"{path}:train_labels: a virtual dataset whose sources lead in a circle ({path}:"
        f"train_labels → {path}:train_labels): HDF5 would crash reading it"
    )
    _refuses(path, "train_labels", expected)
    code, stderr, records = _train(path, tmp_path / "out")  # the run's key reads it first
    assert (code, stderr) == (3, [f"coretrain: {expected}"])
    assert events(records, "end")[-1]["exit_code"] == 3


def test_hdf5_virtual_sources_are_followed_through_other_files_to_a_circle_or_a_gap(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    _virtual(a, "x", (4, 3), ("b.h5", "y"))
    _virtual(b, "y", (4, 3), ("a.h5", "x"))
    circle = f"{a}:x → {b}:y → {a}:x"
    expected = f"a virtual dataset whose sources lead in a circle ({circle})"
    _refuses(a, "x", f"{a}:x: {expected}: HDF5 would crash reading it")
    b.unlink()
    _virtual(b, "y", (4, 3), ("gone.h5", "z"))  # was a fill value, silently
    gap = f"gone.h5 (a source of its source {b}:y)"
    expected = f"a virtual dataset whose source {gap} is not there"
    _refuses(a, "x", f"{a}:x: {expected} (HDF5 would read its fill value in its place)")


def test_an_hdf5_virtual_dataset_may_read_one_source_by_several_ways(tmp_path: Path) -> None:
    """Not a circle: two halves of one dataset, one of them through another virtual one."""
    values = np.arange(24, dtype="<f4").reshape(8, 3)
    path = _h5(tmp_path / "d.h5", {"raw": values})
    _virtual(path, "mid", (8, 3), (".", "raw"))
    _virtual(path, "x", (8, 3), (".", "raw"), (".", "mid"))
    got = np.concatenate(list(open_array(path, "x").chunks(Shape(3), False)))
    np.testing.assert_array_equal(got, values)


def test_the_external_raw_file_of_an_hdf5_virtual_source_is_checked_as_the_datasets_own(
    tmp_path: Path,
) -> None:
    raw, src = tmp_path / "empty.raw", tmp_path / "src.h5"
    raw.write_bytes(b"")
    with h5py.File(src, "w") as f:
        f.create_dataset("y", shape=(4, 3), dtype="<f4", external=[(str(raw), 0, 48)])
    _virtual(tmp_path / "d.h5", "x", (4, 3), ("src.h5", "y"))
    _refuses(
        tmp_path / "d.h5",
        "x",
        f"{raw}: the external raw data file of HDF5 dataset {src}:y holds 0 bytes, 48 fewer "
        "than its segment needs (48 bytes of values from byte 0): HDF5 would read zeros in "
        "their place",
    )
