"""The resident (in-memory gather) and streamed (chunked preadv) pipelines give the same batches.

tf.data and TensorFlow's thread pools are process-global: the pipelines run in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    import tensorflow as tf
    from app.config import TrainConfig
    from app.data.input import pipeline
    from tests.conftest import prepare_cache

    data, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    config = TrainConfig.of(data_dir=data, output_dir=tmp / "out", cache_dir=tmp / "cache")
    c = prepare_cache(config)
    limit = json.loads(sys.argv[3])
    kw = dict(seed=3, batch_size=100, start_step=0, end_step=7)  # 700 of 240 rows: 3 epochs
    out = {"limit": pipeline.resident_limit(limit), "bytes": pipeline.split_bytes(c)}
    got = {}
    from app.data.input import order, stream
    kw["stats"] = stream.Stats.of(c)
    rows = None
    if len(sys.argv) > 4:  # a subset of the training rows (e.g. a validation split held out)
        picked = np.random.default_rng(5).choice(c.train_size, int(sys.argv[4]), replace=False)
        rows = np.sort(picked)
    n = c.train_size if rows is None else len(rows)
    ids = np.arange(c.train_size) if rows is None else rows
    for resident in (True, False):
        given = pipeline.train_input(c, 1, resident=resident, rows=rows, **kw)
        from app.data.input import mapped

        if given.resident is not None:
            resident_rows = given.resident.features.shape[0]
        got[resident] = [
            tuple(t.numpy() for t in mapped.batch(e, given.held)) for e in given.dataset
        ]
    st = kw["stats"]
    x_all = (np.asarray(c.features("train")) - st.feature_mean) * st.feature_inv
    y_all = (np.asarray(c.labels("train")) - st.label_mean) / st.label_std
    same = expected = True
    for step, ((xr, yr), (xs, ys)) in enumerate(zip(got[True], got[False], strict=True)):
        idx = ids[np.sort(order.batch_indices(3, step, 100, n))]
        same &= bool(np.array_equal(xr, xs) and np.array_equal(yr, ys))
        expected &= bool(np.array_equal(xr[..., 0], x_all[idx]) and np.array_equal(yr, y_all[idx]))
    out["held_rows"] = int(resident_rows)
    out.update(steps=len(got[True]), shape=list(got[True][0][0].shape), same=same,
               expected=expected)
    print(json.dumps(out))
    """
)


def _python(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter with ``args``; the JSON of its last stdout line."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _run(tiny_data: Path, tmp_path: Path, memory_limit: int | None, *subset: str) -> dict:
    return _python(SCRIPT, str(tiny_data), str(tmp_path), json.dumps(memory_limit), *subset)


def test_resident_and_streamed_batches_are_identical_and_the_right_rows(
    tiny_data: Path, tmp_path: Path
) -> None:
    r = _run(tiny_data, tmp_path, memory_limit=1 << 30)
    assert r["limit"] == (1 << 30) // 4
    assert r["bytes"] == 4 * 240 * (20 * 195 + 3)
    assert r["steps"] == 7
    assert r["shape"] == [100, 20, 195, 1]
    assert r["same"] is True
    assert r["expected"] is True


def test_a_subset_of_the_training_rows_is_read_the_same_way_in_both(
    tiny_data: Path, tmp_path: Path
) -> None:
    # 150 of the 240 rows (as when rows are held out for validation): both pipelines read
    # only those, by position in the sorted subset ("expected": the exact rows); the
    # resident split is the cache file mapped, every row by its id, nothing copied.
    r = _run(tiny_data, tmp_path, 1 << 30, "150")
    assert r["bytes"] == 4 * 240 * (20 * 195 + 3)  # the whole split, as reported
    assert r["held_rows"] == 240
    assert r["steps"] == 7
    assert r["same"] is True
    assert r["expected"] is True


def test_without_a_memory_limit_the_limit_is_a_share_of_physical_memory(
    tiny_data: Path, tmp_path: Path
) -> None:
    import os

    r = _run(tiny_data, tmp_path, memory_limit=None)
    assert r["limit"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def test_the_split_is_held_when_the_run_reads_it_more_than_once(
    tiny_data: Path, tmp_path: Path
) -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from app.config import TrainConfig
        from app.data.input import pipeline
        from tests.conftest import prepare_cache

        data, tmp = Path(sys.argv[1]), Path(sys.argv[2])
        c = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp, cache_dir=tmp / "c"))
        out = {}
        for limit, steps in ((None, 10_000), (None, 1), (1000, 10_000)):
            got = pipeline.choose_input(c, limit, 40, steps)
            out[f"{limit}-{steps}"] = [got.resident, got.why, got.load_s, got.stream_s]
        print(json.dumps(out))
        """
    )
    got = _python(code, str(tiny_data), str(tmp_path))
    assert got["None-10000"][0] is True  # 10,000 batches of 40 rows: 1,667 epochs
    assert got["None-1"][0] is False  # one batch: loading all 240 rows costs more
    assert got["1000-10000"][0] is False and "larger than" in got["1000-10000"][1]
    # Where the split could be held, both costs are given; where it can't, neither.
    assert got["None-1"][2] > 0 and got["None-1"][3] > 0
    assert got["None-10000"][3] > got["None-10000"][2]
    assert got["1000-10000"][2:] == [None, None]


RESUME = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from app.config import TrainConfig
    from app.data.input import mapped, pipeline, stream
    from tests.conftest import prepare_cache

    data, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    c = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp / "out", cache_dir=tmp / "c"))
    def batches(start):
        given = pipeline.train_input(c, 1, seed=9, batch_size=10, start_step=start,
                                     end_step=40, stats=stream.Stats.of(c))
        assert given.resident is None and given.reader is not None
        return [tuple(t.numpy() for t in mapped.batch(e, given.held)) for e in given.dataset]

    straight, resumed = batches(0), batches(13)
    same = all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(straight[13:], resumed, strict=True))
    print(json.dumps({"straight": len(straight), "resumed": len(resumed), "same": same,
                      "differ": not np.array_equal(straight[0][1], straight[1][1])}))
    """
)


def test_a_resumed_streamed_pipeline_yields_the_same_batches(
    tiny_data: Path, tmp_path: Path
) -> None:
    # 240 rows in batches of 10: three windows an epoch, 40 steps over almost two epochs;
    # resumed at step 13, inside the second chunk of 8 steps.
    got = _python(RESUME, str(tiny_data), str(tmp_path))
    assert got == {"straight": 40, "resumed": 27, "same": True, "differ": True}


HELD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from app.config import TrainConfig
    from app.data.input import mapped, pipeline
    from tests.conftest import prepare_cache

    def rss(kind):
        line = [x for x in open("/proc/self/status") if x.startswith(kind)][0]
        return int(line.split()[1]) * 1024

    data, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    c = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp, cache_dir=tmp / "c"))
    size = pipeline.split_bytes(c)
    out = {"size": size}
    for name, limit in (("room", 2 * size), ("no_room", size + size // 5)):
        got = pipeline.choose_input(c, limit, 40, 10_000)
        out[name] = [got.resident, got.why, got.cached]
    anon, file = rss("RssAnon"), rss("RssFile")
    held = mapped.hold(c, None)
    out["anon_growth"], out["file_growth"] = rss("RssAnon") - anon, rss("RssFile") - file
    print(json.dumps(out))
    """
)


def test_a_split_the_page_cache_may_hold_is_held_without_a_copy(
    tiny_data: Path, tmp_path: Path
) -> None:
    got = _python(HELD, str(tiny_data), str(tmp_path))
    # A limit of twice the split: over the resident share (1/4), within the page cache's
    # (3/4): held, and the share of it the page cache holds is said (it was just written).
    resident, why, cached = got["room"]
    assert resident is True and "page cache holds" in why and 0.9 <= cached <= 1.0
    # 1.2 × the split: the features file is more than 3/4 of it: streamed, and why.
    resident, why, cached = got["no_room"]
    assert resident is False and "more than the page cache may hold" in why
    # Held is mapped, not copied: the process gains the file's pages, not anonymous memory
    # (a writable private mapping populated with MAP_POPULATE copies every page).
    assert got["file_growth"] >= 0.9 * 4 * 240 * 20 * 195
    assert got["anon_growth"] < 0.1 * got["size"]


def test_a_streamed_splits_validation_rows_are_held_within_a_quarter_of_the_resident_limit(
    tiny_data: Path, tmp_path: Path
) -> None:
    from app.budget import memory
    from app.config import TrainConfig
    from app.data.input import pipeline
    from tests.conftest import prepare_cache

    c = prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path))
    row = memory.split_bytes(1, c.height * c.width, c.num_outputs)
    limit = 160 * row  # resident limit 40 rows: 10 of them held
    assert pipeline.holds_validation(c, 10, limit)
    assert not pipeline.holds_validation(c, 11, limit)
    assert pipeline.holds_validation(c, 10_000, 4 << 30)  # the default sample in 4 GiB
