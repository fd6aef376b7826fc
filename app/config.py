"""Configuration as frozen dataclasses: every default and help text stated once, here.

Each field is declared with :func:`option`, whose metadata (help, flag name, bounds,
choices) is all the CLI needs: ``app.cli`` generates its click options from these classes
(each also read from ``CORETRAIN_<FLAG>``), and a test checks the README's option table
against them. The classes validate themselves, so a config built by a test or a benchmark
obeys the same bounds as one from the command line. Units are in the help texts.
No click, no TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from app.options import Options, flat, from_flat, group, option

FILE_HELP = (
    "File name in --data: text (plain or gzip) or a .npy array, recognised by its content "
    "(the array's name when --data is a .npz or HDF5 file). Without it the file is found by "
    "its default name: .txt, .txt.gz or .npy (the array named after it)."
)
FORMULATION_CHOICES = ("auto", "fast", "plain")
PRECISION_CHOICES = ("auto", "float32", "bfloat16")
OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("cosine", "exponential", "constant")
#: Whether ``--precision auto`` may measure bfloat16 (on a CPU with native bf16 only): yes,
#: its accuracy parity with float32 holds for the default recipe (docs/quality.md,
#: "bfloat16"; app.training.state.choose).
BFLOAT16_IN_AUTO = True


@dataclass(frozen=True)
class DataConfig(Options):
    """The data files, their shape and how they are read and split (the inputs:
    app/training/admit/sources.py, app/training/inputs/, app/data/)."""

    data_dir: Path = option(
        help="Directory with train/test feature and label files (read only), or one .npz "
        "or HDF5 file holding the arrays train_features, train_labels, test_features and "
        "test_labels.",
        flag="--data",
        metavar="DIR|FILE",
    )
    train_features: str | None = option(
        None, FILE_HELP, metavar="NAME", shown_default="train_features.txt[.gz] or .npy"
    )
    train_labels: str | None = option(
        None, FILE_HELP, metavar="NAME", shown_default="train_labels.txt[.gz] or .npy"
    )
    test_features: str | None = option(
        None, FILE_HELP, metavar="NAME", shown_default="test_features.txt[.gz] or .npy"
    )
    test_labels: str | None = option(
        None, FILE_HELP, metavar="NAME", shown_default="test_labels.txt[.gz] or .npy"
    )
    height: int = option(
        20, "Feature rows H (a line holds H×W floats); the CNN takes H ≥ 8.", minimum=1,
        identity=True,
    )  # fmt: skip
    width: int = option(195, "Feature columns W; the CNN takes W ≥ 55.", minimum=1, identity=True)
    validation_fraction: float = option(
        0.1,
        "Fraction of the training rows held out (chosen by --seed) to evaluate during "
        "training, stop at --target-loss and choose the exported step; 0: none (then the "
        "test set is evaluated and the last step exported).",
        minimum=0,
        below=0.5,
        identity=True,
    )
    allow_nonfinite: bool = option(
        False,
        "Accept NaN/Inf tokens in the data files (in the training files only with "
        "--no-standardize: the statistics would be NaN).",
        flag="--allow-nonfinite/--reject-nonfinite",
    )


@dataclass(frozen=True)
class CacheConfig(Options):
    """The binary data cache: where it is, its bound and what it keeps (app/data/cache/entry.py)."""

    cache_dir: Path | None = option(
        None,
        "Binary data cache directory. By default one per user, shared by all their runs; "
        "OUTPUT/cache when there is none: no HOME, or one that can't be written (a "
        "cache_default warning says why).",
        directory=True,
        shown_default="$XDG_CACHE_HOME/coretrain or ~/.cache/coretrain",
    )
    max_cache_bytes: int | None = option(
        None,
        "Refuse (exit 3) a data set whose binary cache would take more than this many bytes: "
        "estimated before converting, counted while converting. The free space of the "
        "cache's file system is a bound too. The rows rounded to bfloat16 a bfloat16 step "
        "may make (half the features' bytes) are kept within the same bounds, else it "
        "trains on the float32 rows.",
        minimum=1,
        metavar="BYTES",
        shown_default="the free space",
    )
    cache_keep: int = option(
        4,
        "Data sets kept side by side in the cache directory: once a run has its cache, the "
        "least recently used beyond this many (or --cache-keep-bytes) are removed, except "
        "those a live run uses; only caches coretrain marked as its own.",
        minimum=1,
    )
    cache_keep_bytes: int | None = option(
        None,
        "Bytes the data sets kept in the cache directory may take together (the run's own "
        "cache always stays), under the same rule as --cache-keep.",
        minimum=1,
        metavar="BYTES",
        shown_default="no bound",
    )


@dataclass(frozen=True)
class RecipeConfig(Options):
    """How the weights are trained: the batch, the optimizer, its learning-rate schedule,
    dropout, the seed and whether the data are standardised (the step and its recipe:
    app/training/loop/step.py, recipe.py)."""

    batch_size: int = option(
        1000, "Samples per step (per worker in a multi-worker run).", minimum=1, identity=True
    )
    optimizer: str = option(
        "adam",
        "Optimizer (Keras'): sgd (with --momentum), adam, or adamw (with --weight-decay).",
        choices=OPTIMIZERS,
        identity=True,
    )
    learning_rate: float = option(0.01, "Initial (peak) learning rate.", above=0, identity=True)
    lr_schedule: str = option(
        "cosine",
        "Learning-rate schedule: exponential (× --lr-decay every --lr-decay-steps steps, "
        "staircase), cosine (from --learning-rate down to 0 at --max-steps) or constant.",
        choices=SCHEDULES,
        identity=True,
    )
    lr_warmup_steps: int | None = option(
        None,
        "Steps of linear warmup from 0 to --learning-rate before the cosine decay (cosine; "
        "at most --max-steps - 1).",
        minimum=0,
        identity=True,
        shown_default="a tenth of --max-steps",
    )
    lr_decay: float = option(
        0.8,
        "Learning-rate factor per decay period (exponential).",
        above=0,
        maximum=1,
        identity=True,
    )
    lr_decay_steps: int = option(
        200, "Steps per decay period (exponential).", minimum=1, identity=True
    )
    momentum: float = option(0.8, "SGD momentum (sgd).", minimum=0, below=1, identity=True)
    weight_decay: float = option(
        0.004,
        "Decoupled weight decay per step, as a fraction of the learning rate (adamw); the "
        "loss's L2 terms apply to every optimizer.",
        minimum=0,
        identity=True,
    )
    keep_prob: float = option(
        1.0,
        "Dropout keep probability in training (1: no dropout).",
        above=0,
        maximum=1,
        identity=True,
    )
    seed: int = option(
        0,
        "Seed for initialisation, data order, dropout and the validation split.",
        minimum=0,
        identity=True,
    )
    standardize: bool = option(
        True,
        "Standardise features and labels with training-set statistics.",
        flag="--standardize/--no-standardize",
        identity=True,
    )


@dataclass(frozen=True)
class ScheduleConfig(Options):
    """When the loop evaluates, checkpoints and stops, in steps (the controller:
    app/training/loop/controller.py)."""

    max_steps: int = option(
        3300,
        "Train up to this absolute step (one step = one batch); a rerun resumes.",
        minimum=1,
    )
    eval_every: int = option(
        100,
        "Evaluate every N steps: the validation RMSE (the test RMSE with --validation-fraction 0).",
        minimum=1,
    )
    eval_rows: int = option(
        10_000,
        "Validation rows evaluated every --eval-every steps: a fixed sample drawn by the seed "
        "when the validation split is larger (0: all of them; docs/quality.md, 'Evaluating a "
        "sample').",
        minimum=0,
    )
    checkpoint_every: int = option(100, "Save a checkpoint every N steps.", minimum=1)
    keep_checkpoints: int = option(3, "Checkpoints kept on disk.", minimum=1)
    steps_per_loop: int = option(
        0,
        "Training steps per call into TensorFlow (0: chosen at start, about 0.5 s of "
        "work per call); cut at every evaluation, checkpoint and the last step.",
        minimum=0,
        shown_default="0 (auto)",
    )
    target_loss: float = option(
        0.01,
        "Stop early once the evaluated RMSE (raw label units; validation, or test with "
        "--validation-fraction 0) is below this.",
        metavar="RMSE",
    )


@dataclass(frozen=True)
class ComputeConfig(Options):
    """How the steps are computed, as asked: the formulation and precision (``auto``:
    measured at start, app/training/state/choose.py, whose ``Choice`` is the decision) and
    what a change of the CPU budget does."""

    formulation: str = option(
        "auto",
        "CNN implementation (the same function and checkpoint layout): auto times both on "
        "this CPU at start and takes the faster, for the training step and, apart, for the "
        "evaluation's forward pass.",
        choices=FORMULATION_CHOICES,
    )
    precision: str = option(
        "auto",
        "Compute precision: float32, or bfloat16 products with float32 variables, loss and "
        "export; auto times both on a CPU with native bf16 and takes the faster (their "
        "accuracy matches: docs/quality.md), float32 elsewhere. A resumed run keeps its "
        "precision.",
        choices=PRECISION_CHOICES,
    )
    replan: str = option(
        "on-change",
        "When the CPU budget changes while training (e.g. a pod resized in place) so that "
        "the thread plan would change: on-change saves a checkpoint and restarts TensorFlow "
        "with the new plan; never only logs it. Multi-worker runs never re-plan.",
        choices=("on-change", "never"),
    )

    def precisions(self, native_bf16: bool) -> tuple[str, ...]:
        """The precisions this run may compute in on a CPU with (``native_bf16``) or without
        native bfloat16 dot products: ``--precision`` as given; under auto float32, and
        bfloat16 too where the CPU has it natively and :data:`BFLOAT16_IN_AUTO` allows it
        (the candidates app/training/state/choose.py times; the plan turns oneDNN on for
        them)."""
        if self.precision != "auto":
            return (self.precision,)
        if BFLOAT16_IN_AUTO and native_bf16:
            return ("float32", "bfloat16")
        return ("float32",)


@dataclass(frozen=True)
class PublishConfig(Options):
    """Where and on which rule the final model is published (app/release/publish.py)."""

    publish_dir: Path | None = option(
        None,
        "Publish the final model here (an existing directory: TensorFlow Serving's base "
        "path) as a version numbered above every one there, unless it is worse than the "
        "served version on this run's test set beyond noise (--publish-tolerance) or its "
        "serving signature differs; a rejected model ends with exit 7.",
        directory=True,
        shown_default="none",
    )
    publish_tolerance: float | None = option(
        None,
        "Publish when the test RMSE is at most the newest version's × (1 + this), without "
        "the noise rule. Default: refused only when worse than the newest version beyond "
        "the test set's bootstrap interval and the measured run-to-run spread "
        '(docs/deploy.md, "The gate").',
        minimum=0,
        shown_default="the noise rule",
    )
    publish_keep: int = option(
        0,
        "Versions kept in --publish-dir (the oldest are removed, never the newest); 0 keeps all.",
        minimum=0,
    )
    publish_allow_signature_change: bool = option(
        False,
        "Publish a model whose serving signature (input width, number of outputs) differs "
        "from the served version's; by default it is refused with exit 7 before training, "
        'as its clients would break (docs/deploy.md, "Changing the signature").',
        flag="--publish-allow-signature-change/--publish-same-signature",
    )


@dataclass(frozen=True)
class TrainConfig(Options):
    """Everything one training run needs, in groups by the part that reads them; the
    command line sees their options flat, in :attr:`ORDER` (:func:`app.options.option_fields`,
    built by :meth:`of`). The defaults are the seed's, but for the recipe (optimizer,
    schedule, dropout), chosen by measurement (docs/quality.md); the seed's recipe is
    reachable with options (README, "The seed's recipe").

    Steps are optimizer updates of one (global) batch; a batch is counted in samples.
    """

    output_dir: Path = option(
        help="Directory for checkpoints/, model/, logs/, metrics.json (and cache/ when there "
        "is no cache directory: --cache-dir).",
        flag="--output",
        directory=True,
    )
    data: DataConfig = group(DataConfig, required=True)
    cache: CacheConfig = group(CacheConfig)
    recipe: RecipeConfig = group(RecipeConfig)
    schedule: ScheduleConfig = group(ScheduleConfig)
    compute: ComputeConfig = group(ComputeConfig)
    publishing: PublishConfig = group(PublishConfig)

    #: The options in ``--help``'s and the README's order (an option not listed comes right
    #: after the one declared before it in its group).
    ORDER: ClassVar[tuple[str, ...]] = (
        "data_dir",
        "output_dir",
        "cache_dir",
        "max_cache_bytes",
        "cache_keep",
        "cache_keep_bytes",
        "train_features",
        "train_labels",
        "test_features",
        "test_labels",
        "height",
        "width",
        "max_steps",
        "batch_size",
        "eval_every",
        "eval_rows",
        "checkpoint_every",
        "keep_checkpoints",
        "steps_per_loop",
        "target_loss",
        "optimizer",
        "learning_rate",
        "lr_schedule",
        "lr_warmup_steps",
        "lr_decay",
        "lr_decay_steps",
        "momentum",
        "weight_decay",
        "keep_prob",
        "validation_fraction",
        "seed",
        "standardize",
        "allow_nonfinite",
        "formulation",
        "precision",
        "publish_dir",
        "publish_tolerance",
        "publish_keep",
        "publish_allow_signature_change",
        "replan",
    )

    @classmethod
    def of(cls, **values: Any) -> TrainConfig:
        """A configuration from options by name (``data_dir=…, batch_size=…``), each group
        built from its own; an option not given takes its default."""
        built: TrainConfig = from_flat(cls, values)
        return built

    def with_options(self, **values: Any) -> TrainConfig:
        """A new configuration: this one with the options ``values`` (by name) changed."""
        return TrainConfig.of(**{**flat(self), **values})

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every option, flat (paths as strings)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in flat(self).items()}


@dataclass(frozen=True)
class GenerateConfig(Options):
    """``coretrain generate``: the synthetic demo data set (app/data/synthetic.py)."""

    out: Path = option(help="Directory to write the four data files into.", directory=True)
    train: int = option(3000, "Training samples (lines).", minimum=1)
    test: int = option(600, "Test samples (lines).", minimum=1)
    seed: int = option(0, "Random seed.", minimum=0)
    kind: str = option(
        "demo",
        "demo: one peak, 3 labels (the quick start's); lines: five narrow decaying lines, "
        "15 labels (harder; app/data/synthetic.py).",
        choices=("demo", "lines"),
    )


@dataclass(frozen=True)
class PredictConfig(Options):
    """``coretrain predict``: a trained model applied to a features file."""

    model: Path = option(
        help="A run's model/ directory, one published version, or a publish directory (its "
        "newest version is used).",
        directory=True,
    )
    features: Path = option(
        help="Features in any training format, recognised by content: text (one sample of "
        "H×W floats per line, plain or gzip), .npy, or an array of a .npz / HDF5 file "
        "(--array; by default features, else test_features, else its only array).",
    )
    out: Path = option(
        help="Where to write the predictions: one line of K values per input line, or a "
        "(n, K) float32 array when the name ends in .npy. A file is replaced whole once "
        "complete; a FIFO, a pipe or a device (/dev/stdout) is written through.",
        output=True,
    )
    array: str | None = option(
        None,
        "The array to read when --features is a .npz or HDF5 file, by name (as train's "
        "--test-features names one in a --data file).",
        metavar="NAME",
        shown_default="features, test_features or the only one",
    )
    batch_size: int = option(
        1000, "Lines predicted at a time (memory is bounded by this).", minimum=1
    )
    allow_nonfinite: bool = option(
        False,
        "Accept NaN/Inf values in the features file.",
        flag="--allow-nonfinite/--reject-nonfinite",
    )
