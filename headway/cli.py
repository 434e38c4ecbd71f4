"""`headway COMMAND [ARGS...]`: the project's one command line. It only picks the subcommand
and hands the rest of the arguments to its implementation, imported when it runs (so that
`headway --help` is fast); each implementation parses its own options and owns its exit codes."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

PROG = "headway"
RUN = "run one experiment in Flower's simulation engine and write its results folder"
GENERATE = "write the files derived from the run-config schema (--check: fail if one is stale)"
SUBMIT = "submit a run to a deployment (or follow one: --run-id), show its log, exit 0 complete / 1 failed / 130, 143 interrupted"
BENCH = "run benchmarks/NAME.py of a source checkout with ARGS (headway bench NAME [ARGS...])"
EPILOG = (
    "`headway COMMAND --help` shows a command's options. On a deployment, submit runs with\n"
    "`headway submit CONNECTION [--run-config ...]` (a connection that `headway connect` writes): it streams\n"
    "the log like `flwr run . CONNECTION --stream` and exits with the run's status, which `flwr run` does not."
)


def commands() -> dict[str, str]:
    """Every subcommand with its one-line description, in the order `headway --help` lists them."""
    from headway.deploy import COMMANDS as DEPLOY  # light: the deployment code imports its heavy parts when it runs

    return {"run": RUN, **DEPLOY, "submit": SUBMIT, "generate": GENERATE, "bench": BENCH}


def parser() -> argparse.ArgumentParser:
    """The top level, for `headway --help` and errors: the subcommands and what each does."""
    listing = "\n".join(f"  {name:<10} {text}" for name, text in commands().items())
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [-h] [--version] COMMAND [ARGS...]",
        description="headway: federated learning on Flower that shares data summaries and heads instead of whole networks.",
        epilog=f"commands:\n{listing}\n\n{EPILOG}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="store_true", help="print headway's version")
    return p


def main(argv: list[str] | None = None) -> int:
    """`headway` with ``argv`` (default: the command line); the subcommand's exit code, 2 for a
    command line it cannot dispatch."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        if argv:
            parser().print_help()
            return 0
        parser().print_usage(sys.stderr)
        print(f"{PROG}: error: give a command (see {PROG} --help)", file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"headway {version('headway')}")
        except PackageNotFoundError:
            print("headway (not installed: a source checkout)")
        return 0
    known = commands()
    if name not in known:
        parser().print_usage(sys.stderr)
        print(f"{PROG}: error: unknown command {name!r} (choose from {', '.join(known)})", file=sys.stderr)
        return 2
    try:
        return dispatch(name, rest)
    except SystemExit as exc:  # argparse's --help and usage errors, and `raise SystemExit("error: ...")`
        return _exit_code(exc)


def dispatch(name: str, argv: list[str]) -> int:
    """Run subcommand ``name`` with its own arguments; its exit code."""
    if name == "run":
        from headway.simulation.runner import main as run

        return run(argv, prog=f"{PROG} run")
    if name == "generate":
        if importlib.util.find_spec("headway.generate") is None:
            print(f"error: `{PROG} generate` is not part of this version of headway", file=sys.stderr)
            return 2
        from headway.generate import main as generate

        return int(generate(argv) or 0)
    if name == "bench":
        return bench(argv)
    if name == "submit":
        from headway.submit import main as submit

        return submit(argv, prog=f"{PROG} submit")
    from headway.deploy import main as deploy

    return deploy([name, *argv], prog=PROG)


def _exit_code(exc: SystemExit) -> int:
    """The exit code the interpreter would give for ``exc`` (printing a message code, as it does)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def checkout() -> Path | None:
    """The source checkout whose benchmarks/ `headway bench` runs: the one this package lives in,
    else the current directory; None when neither holds benchmarks (an installed headway)."""
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "benchmarks" / "__init__.py").is_file() and (root / "pyproject.toml").is_file():
            return root
    return None


def benchmarks(root: Path) -> list[str]:
    """The benchmark modules of ``root``/benchmarks: those that define a ``main``."""
    return sorted(p.stem for p in (root / "benchmarks").glob("*.py") if re.search(r"^def main\(", p.read_text(), re.MULTILINE))


def bench(argv: list[str]) -> int:
    """`headway bench NAME [ARGS...]`: ``benchmarks.NAME.main`` with ARGS, from a source checkout."""
    root = checkout()
    if root is None:
        print(
            f"error: `{PROG} bench` runs the benchmarks of a source checkout (they are not installed): run it in the repository's root",
            file=sys.stderr,
        )
        return 2
    names = benchmarks(root)
    if not argv or argv[0] in ("-h", "--help"):
        print(
            f"usage: {PROG} bench NAME [ARGS...]\n\nrun benchmarks/NAME.py of a source checkout with ARGS; `{PROG} bench NAME --help` shows its options"
        )
        print(f"\nbenchmarks in {root / 'benchmarks'}: {', '.join(names)}")
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in names:
        print(f"error: no benchmark {name!r} in {root / 'benchmarks'} (choose from {', '.join(names)})", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    run = importlib.import_module(f"benchmarks.{name}").main
    if inspect.signature(run).parameters:
        return int(run(args) or 0)
    saved = sys.argv  # a benchmark whose main() reads sys.argv
    sys.argv = [f"{PROG} bench {name}", *args]
    try:
        return int(run() or 0)
    finally:
        sys.argv = saved
