"""`python -m benchmarks list | run NAME --else-running TEXT [--force] | parts NAME --else-running TEXT [--commit
REV] | page [--check]`: the benchmark suite's command line (see `benchmarks/__init__.py`). Bad input is one line on
stderr and exit 2."""

from __future__ import annotations

import argparse
import sys

from compressor.core.errors import UserError


def _list() -> None:
    from benchmarks.suite import RESULTS, load_experiments

    for name, exp in load_experiments().items():
        state = "measured" if (RESULTS / f"{name}.json").exists() else "not measured"
        print(f"{name} ({state}): {exp.figure}\n    goal: {exp.goal}")


def _run(args: argparse.Namespace) -> None:
    from benchmarks.runner import run_experiment
    from benchmarks.suite import experiment

    run_experiment(experiment(args.name), args.else_running, force=args.force)


def _parts(args: argparse.Namespace) -> None:
    from benchmarks.parts import parts_dir, store_parts
    from benchmarks.suite import experiment

    exp = experiment(args.name)
    stored = store_parts(exp, args.else_running, commit=args.commit)
    print(f"{exp.name}: stored {len(stored)} parts in {parts_dir(exp).name}/ (commit them to resume elsewhere)")


def _page(args: argparse.Namespace) -> None:
    from benchmarks.page import PAGE, page_text, write_page

    if args.check:
        if PAGE.read_text() != page_text():
            raise UserError(
                "docs/results.md: differs from its template and the results; run `python -m benchmarks page`"
            )
        print("docs/results.md matches its template and the results")
        return
    print(f"wrote {write_page().name}")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the declared experiments, their figures and goals")
    run = sub.add_parser("run", help="run (or resume) one experiment into benchmarks/results/NAME.json")
    run.add_argument("name")
    run.add_argument("--else-running", required=True, help="what else ran on the machine (recorded with the result)")
    run.add_argument("--force", action="store_true", help="run it again from scratch, replacing its result")
    parts = sub.add_parser("parts", help="store the parts of NAME's unfinished outputs another session resumes from")
    parts.add_argument("name")
    parts.add_argument("--else-running", required=True, help="what else ran while they were made")
    parts.add_argument("--commit", help="the commit they ran at, when it is not this checkout's")
    page = sub.add_parser("page", help="regenerate docs/results.md from its template and the results")
    page.add_argument("--check", action="store_true", help="only check that the page is up to date (exit 2 if not)")
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        {"list": lambda a: _list(), "run": _run, "parts": _parts, "page": _page}[args.command](args)
    except UserError as err:
        print(f"benchmarks: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
