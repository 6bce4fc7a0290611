"""A reference model's benchmark candidates (`bench.references`): another model, with its own tokenizer, timed and
evaluated beside the members and the original.

Its candidates are its frontier points (`frontier.reference_points`: PyTorch from its saved model, each exported
variant), each evaluated on the reference's own tokenisation of the same test examples the bench gives every other
candidate (`Candidate.eval_batches`; the bench checks that the labels line up), so the paired McNemar comparisons
hold across tokenizers. Timing uses the bench's synthetic batches, which every model takes.
"""

from __future__ import annotations

from pathlib import Path

from compressor.bench.candidates import Candidate, runtime_candidate
from compressor.bench.frontier import reference_points
from compressor.recipe import ModelSpec
from compressor.sources import TaskData, load_tokenizer
from compressor.sources.batches import eval_batches


def reference_candidates(section: dict, data: TaskData, max_length: int, spec) -> list[Candidate]:
    """The candidates of the reference whose report section is `section`, in `reference_points` order, on the test
    split of `data` tokenised by its own tokenizer (at most `spec.eval_examples`, sampled as the bench samples), and
    its whole validation split likewise (the bench's validation batches, `pipeline.measure.run_bench`)."""
    model_dir = Path(section["model_dir"])
    tokenizer = load_tokenizer(ModelSpec(source=str(model_dir)))
    own = eval_batches(data, tokenizer, "test", max_length, spec.eval_examples, by_length=True)
    own_val = eval_batches(data, tokenizer, "validation", max_length, by_length=True)
    pytorch, *exported = reference_points(section)
    candidates = [runtime_candidate(pytorch.name, pytorch.runtime, model_dir, spec.seq_lens)]
    for point in exported:
        candidates.append(
            runtime_candidate(point.name, point.runtime, point.path, spec.seq_lens, spec.threads, candidates[0])
        )
    for candidate in candidates:
        candidate.eval_batches, candidate.val_batches = own, own_val
    return candidates
