"""The package's import graph (issue 26): imports go one way, top to bottom, and nothing cycles.

Layers, lowest first, as ``docs``/the design draw them: ``core`` (declarations, reduction,
collectives) < ``integrations`` (sinks) < ``journal`` (the run's record) < ``doctor``/``plot`` (read
a journal) < ``publication`` (trainer and publisher sides) < ``callbacks`` < the commands. Read from
the source with :mod:`ast` (imports inside functions count too), so a lazy import cannot hide an
upward edge.
"""

from __future__ import annotations

import ast
import pathlib

import posttrain_metrics

PACKAGE = pathlib.Path(posttrain_metrics.__file__).parent
RANK = {
    "core": 0,
    "integrations": 1,
    "journal": 2,
    "doctor": 3, "plot": 3,
    "publication": 4,
    "callbacks": 5,
    "export": 6, "cli": 7, "demo": 7, "__main__": 7,
}


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:  # `from . import distributed` names a module
                    sub = f"{target}.{alias.name}"
                    targets.add(sub if sub in files else target)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def _rank(module: str) -> int:
    parts = module.split(".")
    return RANK.get(parts[1], 0) if len(parts) > 1 else 8


def test_no_import_goes_up_a_layer() -> None:
    up = sorted(f"{m} -> {t}" for m, ts in _graph().items() for t in ts
                if _rank(t) > _rank(m) and t != "posttrain_metrics")
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_import_graph_has_no_cycle() -> None:
    graph = _graph()
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append([*path[path.index(module):], module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            # a package's __init__ re-exporting its own submodules is not a cycle of jobs
            if not module.startswith(target + ".") and not target.startswith(module + "."):
                visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_top_level_module_has_a_layer() -> None:
    tops = {m.split(".")[1] for m in _graph() if m.count(".") >= 1}
    assert tops <= set(RANK), f"give {sorted(tops - set(RANK))} a layer in RANK"


# A file over LIMIT lines is allowed only with the one job it holds written here (issue 26: "no source
# file over ~500 lines holds more than one job"). Remove an entry when its file is split.
LIMIT = 520
ONE_JOB = {
    "demo/grpo_toy.py": "the demo's toy GRPO trainer (model, rollouts, loss): one job, read top to bottom",
    "integrations/wandb.py": "the W&B sink (start, frames, summaries and step metrics, tables, close): one job",
    "integrations/mlflow/sink.py": "the MLflow sink (start, frames, aggregates, samples, findings, close); sending is in sender.py",
    "core/layout.py": "the packed buffer layout of one collective: one job",
    "core/redact.py": "the redaction rules: one job",
}


def test_long_files_hold_one_job() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > LIMIT}
    unexplained = {p: n for p, n in long.items() if p not in ONE_JOB}
    assert not unexplained, f"files over {LIMIT} lines with no one-job entry: {unexplained}"
    stale = sorted(set(ONE_JOB) - set(long))
    assert not stale, f"ONE_JOB lists files no longer over {LIMIT} lines: {stale}"
