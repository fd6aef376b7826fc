"""Image size and start-up of built images, the way the job runs (docs/deploy.md).

``python3 -m benchmarks.container_startup IMAGE... [--repeats 5] [--json OUT]`` measures each
image with the container engine (``ENGINE``, default podman), every container with a
read-only root, a tmpfs ``/tmp`` and no network, so no ``.pyc`` can be written at run time:

- size: the engine's image size, site-packages (apparent MiB) and its number of ``.pyc``;
- ``import tensorflow``: inside the container, wall-clock and CPU time (``perf_counter`` and
  ``process_time`` around the import; CPU time is what compiling modules costs and varies
  least with other load), and from ``run`` to exit on the host;
- ``train``: from ``run`` to the first ``progress`` event and to exit, on a tiny data set
  (240 samples, batches of 40, progress at step 5, 5 steps, export at the end);
- function: the run exits 0 with ``model/model.keras`` and ``model/saved_model``; then
  ``tf.saved_model.load`` serves it (``serving_default`` and ``serve`` agree) and the Keras
  file gives the same predictions.

One warm-up round, then ``--repeats`` rounds, each running every image once in a rotated
order, so that other load on the machine spreads over the images; medians are printed.
Needs only the standard library on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ENGINE = os.environ.get("ENGINE", "podman")
RUN = [ENGINE, "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp"]
TRAIN = ["--batch-size", "40", "--eval-every", "5", "--checkpoint-every", "100", "--max-steps", "5"]
TIMES = ("import_inner_s", "import_cpu_s", "import_wall_s", "first_progress_s", "train_total_s")

LOAD_CHECK = r"""
import numpy as np, tensorflow as tf
m = tf.saved_model.load("/output/model/saved_model")
f = m.signatures["serving_default"]
(spec,) = f.structured_input_signature[1].values()
x = np.random.default_rng(0).normal(size=(3, spec.shape[1])).astype("float32")
(y,) = f(tf.constant(x)).values()
assert y.shape[0] == 3 and np.isfinite(y.numpy()).all(), y
assert np.allclose(m.serve(tf.constant(x)).numpy(), y.numpy())
import keras, app.model
k = keras.models.load_model("/output/model/model.keras")
assert np.allclose(k.predict(x, verbose=0), y.numpy(), atol=1e-4)
print("LOAD_OK")
"""


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


def size(image: str) -> dict[str, int]:
    total = _run([ENGINE, "image", "inspect", "-f", "{{.Size}}", image]).stdout.strip()
    script = (
        "cd /opt/venv/lib/python3*/site-packages && du -sm --apparent-size . | cut -f1 &&"
        " find . -name '*.pyc' | wc -l"
    )
    mib, pyc = _run([*RUN, "--entrypoint", "sh", image, "-c", script]).stdout.split()
    return {"image_bytes": int(total), "site_packages_mib": int(mib), "pyc_files": int(pyc)}


def import_time(image: str) -> dict[str, float]:
    code = (
        "import time; t, c = time.perf_counter(), time.process_time(); import tensorflow; "
        "print(time.perf_counter() - t, time.process_time() - c)"
    )
    t0 = time.perf_counter()
    proc = _run([*RUN, "--entrypoint", "python", image, "-c", code])
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{image}: import tensorflow failed:\n{proc.stderr[-2000:]}")
    inner, cpu = (float(x) for x in proc.stdout.split()[-2:])
    return {"import_wall_s": wall, "import_inner_s": inner, "import_cpu_s": cpu}


def train(image: str, data: str, work: str) -> dict[str, Any]:
    out = tempfile.mkdtemp(prefix="out-", dir=work)
    os.chmod(out, 0o777)  # the image user writes it
    args = [*RUN, "-v", f"{data}:/data:ro", "-v", f"{out}:/output", image, "train", *TRAIN]
    t0 = time.perf_counter()
    first = None
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None and p.stderr is not None
        for line in p.stdout:
            if first is None and '"event": "progress"' in line:
                first = time.perf_counter() - t0
        rc = p.wait()
        total = time.perf_counter() - t0
        err = p.stderr.read()
    exported = all(os.path.exists(f"{out}/model/{name}") for name in ("model.keras", "saved_model"))
    loaded = False
    if rc == 0 and exported:
        mount = ["-v", f"{out}:/output:ro", "--entrypoint", "python"]
        load = _run([*RUN, *mount, image, "-c", LOAD_CHECK])
        loaded = load.returncode == 0 and "LOAD_OK" in load.stdout
        err += load.stderr
    if not loaded:
        sys.stderr.write(f"{image}: train exit {rc}, exported {exported}\n{err[-2000:]}\n")
    shutil.rmtree(out, ignore_errors=True)
    return {"first_progress_s": first, "train_total_s": total, "ok": loaded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("images", nargs="+")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args(argv)
    images: list[str] = args.images
    with tempfile.TemporaryDirectory(prefix="container-startup-") as work:
        data = os.path.join(work, "data")
        os.mkdir(data)
        os.chmod(data, 0o777)
        tiny = ["--train", "240", "--test", "60", "--seed", "1"]
        gen = _run([*RUN, "-v", f"{data}:/gen", images[0], "generate", "--out", "/gen", *tiny])
        if gen.returncode != 0:
            raise SystemExit(f"generate failed:\n{gen.stderr[-2000:]}")
        results: dict[str, Any] = {img: {"size": size(img), "runs": []} for img in images}
        load_before = os.getloadavg()
        for round_no in range(args.repeats + 1):  # round 0 warms the page cache up
            shift = round_no % len(images)
            for img in images[shift:] + images[:shift]:
                record = {**import_time(img), **train(img, data, work)}
                print(round_no, img, json.dumps(record), file=sys.stderr, flush=True)
                if round_no:
                    results[img]["runs"].append(record)
    failed = False
    print(f"load average before {load_before}, after {os.getloadavg()}")
    print("image  size_MB  site_MiB  pyc  " + "  ".join(TIMES) + "  (median/min, s)")
    for img in images:
        res = results[img]
        runs = [r for r in res["runs"] if r["first_progress_s"] is not None]
        res["median"] = {k: statistics.median(r[k] for r in runs) if runs else None for k in TIMES}
        res["min"] = {k: min(r[k] for r in runs) if runs else None for k in TIMES}
        res["all_ok"] = all(r["ok"] for r in res["runs"])
        failed |= not res["all_ok"]
        s = res["size"]
        times = "  ".join(f"{res['median'][k]:.2f}/{res['min'][k]:.2f}" for k in TIMES if runs)
        print(
            f"{img}  {s['image_bytes'] / 1e6:.0f}  {s['site_packages_mib']}  {s['pyc_files']}  "
            f"{times}  {'ok' if res['all_ok'] else 'FAILED'}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
